#pragma once
// Checkpoint serialisation: the byte format of basic_exchanger::save_state / load_state.
//
// A checkpoint is one rank's state (residuals differ per rank), written to a std::ostream at
// the current position, so it can sit inside a larger model checkpoint. All integers and floats
// are little-endian whatever the host; floats are their IEEE bits.
//
//   header   magic "GFLOWCKP", u32 format version,
//            u64 layout fingerprint, u64 tensor count + one u64 fingerprint per tensor,
//            u64 composition fingerprint + the composition's name (u32 length + bytes),
//            u32 rank, u32 size, u64 pool elements,
//            u64 checksum of every byte before it
//   sections "EXCH" (iteration, fusion numbers, learn_order state and order), "TOPO" (topology engine), "SPRS" (sparsifier
//            engine), each a 4-byte tag followed by what its owner wrote
//   trailer  u64 checksum of every byte before it
//
// The header is checked (its checksum first, so a corrupt byte reads as corruption, not as a
// mismatch) before any section is read; a section's owner reads it into a staging object and
// validates it; the trailer's checksum is verified before anything is applied. So a failed load
// leaves the exchanger as it was.
//
// Reading never trusts a length field: lengths the exchanger knows (pool size, chunk count) must
// match exactly before anything is read, other lengths have a fixed bound, and buffers grow only
// with bytes actually read. A stream that ends early raises parse_error("checkpoint") naming
// what was being read.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../../error.hpp"
#include "../../layout.hpp"
#include "fingerprint.hpp"

namespace gflow::detail {

inline constexpr char checkpoint_magic[8] = {'G', 'F', 'L', 'O', 'W', 'C', 'K', 'P'};
// 2: the tuner's Hybrid switch and its hierarchical fit; 3: EXCH holds the learn_order state;
// 4: OkTopK's parameters lose global_adapt (its global selection became the cut, engines/oktopk/cut.hpp)
inline constexpr std::uint32_t checkpoint_version = 4;
/// Longest composition name a checkpoint may carry (a policy list's name is a few hundred bytes).
inline constexpr std::size_t checkpoint_max_name = std::size_t{1} << 16;

/// A 4-byte section tag, e.g. section_tag("SPRS").
constexpr std::uint32_t section_tag(const char (&s)[5]) noexcept {
  return std::uint32_t(std::uint8_t(s[0])) | std::uint32_t(std::uint8_t(s[1])) << 8 | std::uint32_t(std::uint8_t(s[2])) << 16 |
         std::uint32_t(std::uint8_t(s[3])) << 24;
}

/// A 64-bit hash of a byte sequence, fed in pieces of any size: FNV-1a's step on 8-byte
/// little-endian words (every step is a bijection of the state, so a changed word always changes
/// the result), the tail bytewise, the length mixed in, then a final avalanche.
class stream_hash {
 public:
  void update(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    len_ += n;
    if (fill_ != 0) {  // complete the pending word first
      const std::size_t m = std::min(n, sizeof pend_ - fill_);
      std::memcpy(pend_ + fill_, p, m);
      fill_ += m;
      p += m;
      n -= m;
      if (fill_ != sizeof pend_) return;  // n is 0
      mix(load(pend_));
      fill_ = 0;
    }
    for (; n >= 8; n -= 8, p += 8) mix(load(p));
    std::memcpy(pend_, p, n);  // the tail, n < 8
    fill_ = n;
  }
  [[nodiscard]] std::uint64_t value() const noexcept {
    std::uint64_t h = h_;
    for (std::size_t i = 0; i < fill_; ++i) h = (h ^ pend_[i]) * prime;
    h = (h ^ len_) * prime;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
  }

 private:
  static constexpr std::uint64_t prime = fnv_prime;  // FNV-1a's, as in fingerprint.hpp
  static std::uint64_t load(const unsigned char* p) noexcept {
    std::uint64_t w = 0;
    for (int i = 7; i >= 0; --i) w = (w << 8) | p[i];
    return w;
  }
  void mix(std::uint64_t w) noexcept { h_ = (h_ ^ w) * prime; }
  std::uint64_t h_ = fnv_offset;
  std::uint64_t len_ = 0;
  unsigned char pend_[8] = {};
  std::size_t fill_ = 0;
};

namespace ckpt {
// Little-endian encoding of one value into / out of 1..8 bytes.
template <class U>
void put_le(unsigned char* out, U v) noexcept {
  for (std::size_t i = 0; i < sizeof(U); ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
template <class U>
U get_le(const unsigned char* in) noexcept {
  U v = 0;
  for (std::size_t i = sizeof(U); i-- > 0;) v = static_cast<U>((v << 8) | in[i]);
  return v;
}
template <class E>
using bits_of = std::conditional_t<sizeof(E) == 8, std::uint64_t, std::conditional_t<sizeof(E) == 4, std::uint32_t, std::uint16_t>>;
}  // namespace ckpt

/// Writes checkpoint bytes to a stream and hashes them as they go.
class checkpoint_writer {
 public:
  explicit checkpoint_writer(std::ostream& os) : os_(&os) {}

  void bytes(const void* p, std::size_t n) {
    if (n == 0) return;
    h_.update(p, n);
    os_->write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    written_ += n;
  }
  void u32(std::uint32_t v) { scalar(v); }
  void u64(std::uint64_t v) { scalar(v); }
  void f32(float v) { scalar(std::bit_cast<std::uint32_t>(v)); }
  void f64(double v) { scalar(std::bit_cast<std::uint64_t>(v)); }
  void tag(std::uint32_t t) { u32(t); }
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  /// n elements of an arithmetic type (or a 2/4/8-byte trivially copyable one), preceded by n.
  template <class E>
  void array(const E* p, std::size_t n) {
    u64(n);
    elements(p, n);
  }
  /// n elements, no count (the reader knows n).
  template <class E>
  void elements(const E* p, std::size_t n) {
    static_assert(std::is_trivially_copyable_v<E> && (sizeof(E) == 2 || sizeof(E) == 4 || sizeof(E) == 8));
    if constexpr (std::endian::native == std::endian::little) {
      bytes(p, n * sizeof(E));
    } else {
      unsigned char buf[4096];
      for (std::size_t i = 0; i < n;) {
        const std::size_t m = std::min(n - i, sizeof buf / sizeof(E));
        for (std::size_t j = 0; j < m; ++j) ckpt::put_le(buf + j * sizeof(E), std::bit_cast<ckpt::bits_of<E>>(p[i + j]));
        bytes(buf, m * sizeof(E));
        i += m;
      }
    }
  }
  /// Writes the hash of every byte so far (header and trailer checksums).
  void checksum() { u64(h_.value()); }
  /// Flushes and reports a failed stream with a typed error.
  void finish() {
    os_->flush();
    if (!*os_)
      throw invalid_argument("out", fmt::format("the output stream failed while the checkpoint was written ({} bytes handed to it).", written_),
                             "pass a stream that can take the whole state (check disk space and the file's open mode: binary, writable).");
  }
  [[nodiscard]] std::uint64_t written() const noexcept { return written_; }

 private:
  template <class U>
  void scalar(U v) {
    unsigned char b[sizeof(U)];
    ckpt::put_le(b, v);
    bytes(b, sizeof b);
  }
  std::ostream* os_;
  stream_hash h_;
  std::uint64_t written_ = 0;
};

/// Reads checkpoint bytes from a stream with bounds on every length, hashing them as they go.
/// Every failure is a gflow::parse_error naming the field (`what`).
class checkpoint_reader {
 public:
  explicit checkpoint_reader(std::istream& is) : is_(&is) {}

  void bytes(void* p, std::size_t n, std::string_view what) {
    if (n == 0) return;
    is_->read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    const auto got = static_cast<std::size_t>(is_->gcount());
    if (got != n)
      throw parse_error("checkpoint",
                        fmt::format("the stream ends after {} bytes of the checkpoint, inside {}"
                            " ({} more bytes expected): the checkpoint is truncated.", read_ + got, what, n - got),
                        "load a complete checkpoint written by save_state (a file whose write was interrupted cannot be resumed from).");
    h_.update(p, n);
    read_ += n;
  }
  std::uint32_t u32(std::string_view what) { return scalar<std::uint32_t>(what); }
  std::uint64_t u64(std::string_view what) { return scalar<std::uint64_t>(what); }
  float f32(std::string_view what) { return std::bit_cast<float>(scalar<std::uint32_t>(what)); }
  double f64(std::string_view what) { return std::bit_cast<double>(scalar<std::uint64_t>(what)); }

  /// A section tag; another value means the stream is not at the section the exchanger expects.
  void expect_tag(std::uint32_t tag, std::string_view section) {
    const std::uint32_t t = u32(std::string("the tag of section '") + std::string(section) + "'");
    if (t != tag)
      fail(std::string(section), fmt::format("section '{}' was expected at byte {}"
                                     "; the checkpoint has tag 0x{} there.", section, read_ - 4, hex(t)));
  }

  /// A length-prefixed string of at most max_len bytes.
  std::string str(std::size_t max_len, std::string_view what) {
    const std::uint32_t n = u32(what);
    if (n > max_len) fail(std::string(what), fmt::format("{} claims {} bytes; at most {} are allowed.", what, n, max_len));
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }

  /// A length-prefixed array whose length must be exactly `expected` (a length the exchanger
  /// knows); read into out (resized to expected) only after the length matched.
  template <class E>
  void array_exact(std::vector<E>& out, std::size_t expected, std::string_view what) {
    const std::uint64_t n = u64(what);
    if (n != expected)
      fail(std::string(what), fmt::format("{} holds {} elements in the checkpoint; this exchanger has "
                                  "{}.", what, n, expected));
    out.resize(expected);
    elements(out.data(), expected, what);
  }

  /// A length-prefixed array of at most max_n elements; the buffer grows with the bytes read.
  template <class E>
  std::vector<E> array_upto(std::size_t max_n, std::string_view what) {
    const std::uint64_t n = u64(what);
    if (n > max_n) fail(std::string(what), fmt::format("{} claims {} elements; at most {} are allowed.", what, n, max_n));
    std::vector<E> out;
    constexpr std::size_t step = (std::size_t{1} << 16) / sizeof(E);
    for (std::size_t i = 0; i < n;) {
      const std::size_t m = std::min<std::size_t>(static_cast<std::size_t>(n) - i, step);
      out.resize(i + m);
      elements(out.data() + i, m, what);
      i += m;
    }
    return out;
  }

  /// n elements, no count.
  template <class E>
  void elements(E* p, std::size_t n, std::string_view what) {
    static_assert(std::is_trivially_copyable_v<E> && (sizeof(E) == 2 || sizeof(E) == 4 || sizeof(E) == 8));
    bytes(p, n * sizeof(E), what);
    if constexpr (std::endian::native != std::endian::little) {
      for (std::size_t i = 0; i < n; ++i) {
        unsigned char b[sizeof(E)];
        std::memcpy(b, p + i, sizeof(E));
        p[i] = std::bit_cast<E>(ckpt::get_le<ckpt::bits_of<E>>(b));
      }
    }
  }

  /// Reads a checksum and compares it with the hash of every byte before it.
  void verify_checksum(std::string_view part) {
    const std::uint64_t expect = h_.value();
    const std::uint64_t got = u64(std::string("the ") + std::string(part) + " checksum");
    if (got != expect)
      throw parse_error("checksum",
                        fmt::format("the {} of the checkpoint ({} bytes from its start) does not match its checksum: the bytes were changed after save_state wrote them.", part, read_ - 8),
                        "load an intact copy of the checkpoint (the file is corrupt, or the stream was not opened in binary mode).");
  }

  /// A parse_error about field `subject` of a checkpoint whose checksum may not have been
  /// verified yet (so the message says either could be the cause).
  [[noreturn]] void fail(std::string subject, std::string_view what) const {
    throw parse_error(std::move(subject), std::string(what),
                      "load a checkpoint written by save_state of this gflow version, unmodified (a corrupt or foreign file cannot be resumed from).");
  }

  [[nodiscard]] std::uint64_t consumed() const noexcept { return read_; }

 private:
  template <class U>
  U scalar(std::string_view what) {
    unsigned char b[sizeof(U)];
    bytes(b, sizeof b, what);
    return ckpt::get_le<U>(b);
  }
  static std::string hex(std::uint32_t v) {
    static constexpr char d[] = "0123456789abcdef";
    std::string s(8, '0');
    for (int i = 7; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = d[v & 15u];
    return s;
  }
  std::istream* is_;
  stream_hash h_;
  std::uint64_t read_ = 0;
};

/// Who wrote a checkpoint: what the loading exchanger must match.
struct checkpoint_identity {
  std::uint64_t layout_fp = 0;
  std::vector<std::uint64_t> tensor_fps;
  std::uint64_t composition_fp = 0;
  std::string composition;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::uint64_t pool_elems = 0;
};

template <class Set>
checkpoint_identity make_checkpoint_identity(const Layout& layout, int rank, int size, std::size_t pool_elems) {
  checkpoint_identity id;
  id.layout_fp = layout_fingerprint(layout);
  id.tensor_fps.reserve(layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i) id.tensor_fps.push_back(tensor_fingerprint(layout[i]));
  id.composition = composition_name<Set>();
  id.composition_fp = fnv1a(id.composition);
  id.rank = static_cast<std::uint32_t>(rank);
  id.size = static_cast<std::uint32_t>(size);
  id.pool_elems = pool_elems;
  return id;
}

inline void write_checkpoint_header(checkpoint_writer& w, const checkpoint_identity& id) {
  w.bytes(checkpoint_magic, sizeof checkpoint_magic);
  w.u32(checkpoint_version);
  w.u64(id.layout_fp);
  w.array(id.tensor_fps.data(), id.tensor_fps.size());
  w.u64(id.composition_fp);
  w.str(id.composition);
  w.u32(id.rank);
  w.u32(id.size);
  w.u64(id.pool_elems);
  w.checksum();
}

/// Reads a header (magic, version, identity, header checksum); corruption is a parse_error.
/// `max_tensors` bounds the tensor count read (the loading layout's size + 1 reports a mismatch).
inline checkpoint_identity read_checkpoint_identity(checkpoint_reader& r, std::size_t max_tensors) {
  char magic[sizeof checkpoint_magic];
  r.bytes(magic, sizeof magic, "the magic number");
  if (std::memcmp(magic, checkpoint_magic, sizeof magic) != 0)
    throw parse_error("magic", "the stream does not start with a gflow checkpoint (the magic bytes 'GFLOWCKP' are missing).",
                      "pass the stream save_state wrote, positioned where save_state started writing (open files in binary mode).");
  const std::uint32_t version = r.u32("the format version");
  if (version != checkpoint_version)
    throw parse_error("version",
                      fmt::format("the checkpoint has format version {}; this gflow reads version "
                          "{}.", version, checkpoint_version),
                      "load it with the gflow version that wrote it (the format is versioned; there is no conversion between versions).");
  checkpoint_identity f;
  f.layout_fp = r.u64("the layout fingerprint");
  f.tensor_fps = r.array_upto<std::uint64_t>(max_tensors, "the tensor fingerprints");
  f.composition_fp = r.u64("the composition fingerprint");
  f.composition = r.str(checkpoint_max_name, "the composition name");
  f.rank = r.u32("the rank");
  f.size = r.u32("the number of ranks");
  f.pool_elems = r.u64("the pool size");
  r.verify_checksum("header");
  return f;
}

inline void check_checkpoint_identity(const checkpoint_identity& f, const checkpoint_identity& mine, const Layout& layout, bool check_rank_size);

/// Reads and checks a header against `mine`: corruption is a parse_error, a checkpoint of
/// another layout, composition, rank or size a mismatch_error naming what differs (rank and size
/// only when `check_rank_size`: a re-sharding load checks those itself). `layout` is the loading
/// exchanger's, to name the first tensor that differs.
inline void read_checkpoint_header(checkpoint_reader& r, const checkpoint_identity& mine, const Layout& layout, bool check_rank_size = true) {
  // Bounded by the loading layout's size + 1: enough to report a different tensor count.
  check_checkpoint_identity(read_checkpoint_identity(r, std::max<std::size_t>(mine.tensor_fps.size() + 1, std::size_t{1} << 20)), mine, layout,
                            check_rank_size);
}

/// The checks of read_checkpoint_header on an identity already read (`f`, the checkpoint's).
inline void check_checkpoint_identity(const checkpoint_identity& f, const checkpoint_identity& mine, const Layout& layout, bool check_rank_size) {
  if (f.composition_fp != mine.composition_fp || f.composition != mine.composition)
    throw mismatch_error("composition",
                         "the checkpoint was saved by an exchanger with policies <" + f.composition + ">; this exchanger has <" + mine.composition + ">.",
                         "load it into an exchanger of the same composition (the same Exchanger<...> policies as the run that saved it).");
  if (f.layout_fp != mine.layout_fp || f.tensor_fps != mine.tensor_fps) {
    std::string what = fmt::format("the checkpoint was saved for a layout of {} tensors; this exchanger's has "
                       "{}", f.tensor_fps.size(), mine.tensor_fps.size());
    const std::size_t n = std::min(f.tensor_fps.size(), mine.tensor_fps.size());
    std::size_t i = 0;
    while (i < n && f.tensor_fps[i] == mine.tensor_fps[i]) ++i;
    if (i < mine.tensor_fps.size())
      what += fmt::format(", and the first tensor that differs is {} ('{}' here: name, shape or size changed).", i, layout[i].name);
    else
      what += fmt::format("; the checkpoint's layout has more tensors after tensor {}.", i);
    throw mismatch_error("layout", what, "load it into an exchanger built with the same layout (same tensors, shapes and order) as the run that saved it.");
  }
  if (!check_rank_size) return;
  if (f.size != mine.size)
    throw mismatch_error("size",
                         fmt::format("the checkpoint was saved by a job of {} ranks; this one has {}.", f.size, mine.size),
                         "resume with the same number of ranks, or re-shard the whole set of P checkpoints (gflow::load_resharded, gflow-reshard).");
  if (f.rank != mine.rank)
    throw mismatch_error("rank",
                         fmt::format("the checkpoint was saved by rank {}; this exchanger is rank {}"
                             " of {}.", f.rank, mine.rank, mine.size),
                         "let every rank load the checkpoint it saved itself (residuals differ per rank), e.g. name the files by rank.");
  if (f.pool_elems != mine.pool_elems)
    throw mismatch_error("pool_size",
                         fmt::format("the checkpoint holds a pool of {} elements; this exchanger's has "
                             "{}.", f.pool_elems, mine.pool_elems),
                         "load it into an exchanger built with the same layout as the run that saved it.");
}

/// Throws parse_error(subject) unless every value of v is finite (residuals never hold inf/NaN).
inline void check_finite(const float* v, std::size_t n, const char* subject) {
  for (std::size_t i = 0; i < n; ++i)
    if ((std::bit_cast<std::uint32_t>(v[i]) & 0x7f800000u) == 0x7f800000u)
      throw parse_error(subject,
                        fmt::format("the checkpoint's {} holds a non-finite value at pool index {}"
                            "; gflow never keeps inf or NaN there.", subject, i),
                        "load a checkpoint written by save_state, unmodified.");
}

}  // namespace gflow::detail
