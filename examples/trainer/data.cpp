// Fashion-MNIST from Debian's dataset-fashion-mnist: gzip-compressed IDX files, read with zlib.
// Every defect is a typed gflow error naming the file and what to do.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gflow/error.hpp>

#include "trainer.hpp"

namespace trainer {
namespace {

constexpr const char* reinstall_fix =
    "the file is damaged or is not Fashion-MNIST: reinstall the Debian package (sudo apt-get install --reinstall dataset-fashion-mnist) "
    "or point --data at a directory with intact IDX files.";

// The whole decompressed file (the largest, train images, is 47 MB).
std::vector<std::uint8_t> read_gz(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw gflow::invalid_argument("--data", "'" + path + "' does not exist or is not a file.",
                                  "install the Debian package dataset-fashion-mnist (sudo apt-get install dataset-fashion-mnist), which puts "
                                  "the files in " + std::string(default_data_dir) + ", or pass --data DIR with train-images-idx3-ubyte.gz, "
                                  "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz.");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw gflow::invalid_argument("--data", "cannot open '" + path + "'.", "check the file's permissions.");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  while (true) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int errnum = 0;
      const std::string msg = gzerror(f, &errnum);
      gzclose(f);
      throw gflow::parse_error(path, "gzip data is corrupt (" + msg + ").", reinstall_fix);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  gzclose(f);
  return out;
}

std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | std::uint32_t{b[at + 3]};
}

std::string hex(std::uint32_t v) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

// Checks the header (magic, dimension count) and that the data is exactly as long as announced.
std::vector<std::uint32_t> read_header(const std::vector<std::uint8_t>& b, const std::string& path, std::uint32_t magic, const char* kind) {
  const std::size_t ndim = magic & 0xffu;
  if (b.size() < 4 + 4 * ndim)
    throw gflow::parse_error(path, "the file is " + std::to_string(b.size()) + " bytes, shorter than an IDX header (" +
                                       std::to_string(4 + 4 * ndim) + " bytes).",
                             reinstall_fix);
  if (be32(b, 0) != magic)
    throw gflow::parse_error(path, "magic number " + hex(be32(b, 0)) + " is not that of an IDX " + kind + " file (" + hex(magic) + ").",
                             reinstall_fix);
  std::vector<std::uint32_t> dims(ndim);
  std::size_t expect = 1;
  for (std::size_t d = 0; d < ndim; ++d) {
    dims[d] = be32(b, 4 + 4 * d);
    expect *= dims[d];
  }
  const std::size_t have = b.size() - 4 - 4 * ndim;
  if (have != expect)
    throw gflow::parse_error(path, std::string(have < expect ? "truncated" : "trailing bytes") + ": the header announces " +
                                       std::to_string(expect) + " data bytes, the file holds " + std::to_string(have) + ".",
                             reinstall_fix);
  return dims;
}

}  // namespace

idx_images load_idx_images(const std::string& path) {
  const auto b = read_gz(path);
  const auto dims = read_header(b, path, 0x00000803u, "image (idx3, unsigned byte)");
  if (dims[1] != 28 || dims[2] != 28)
    throw gflow::parse_error(path, "images are " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) + "; the model expects 28x28.",
                             reinstall_fix);
  if (dims[0] == 0) throw gflow::parse_error(path, "the file holds no images.", reinstall_fix);
  idx_images im;
  im.count = dims[0];
  im.rows = dims[1];
  im.cols = dims[2];
  im.pixels.assign(b.begin() + 16, b.end());
  return im;
}

std::vector<std::uint8_t> load_idx_labels(const std::string& path) {
  const auto b = read_gz(path);
  read_header(b, path, 0x00000801u, "label (idx1, unsigned byte)");
  std::vector<std::uint8_t> labels(b.begin() + 8, b.end());
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] > 9)
      throw gflow::parse_error(path, "label " + std::to_string(i) + " is " + std::to_string(labels[i]) + "; Fashion-MNIST has classes 0..9.",
                               reinstall_fix);
  return labels;
}

dataset load_fashion_mnist(const std::string& dir, std::size_t train_limit) {
  dataset d;
  const auto file = [&](const char* name) { return (std::filesystem::path(dir) / name).string(); };
  d.train_images = load_idx_images(file("train-images-idx3-ubyte.gz"));
  d.train_labels = load_idx_labels(file("train-labels-idx1-ubyte.gz"));
  d.test_images = load_idx_images(file("t10k-images-idx3-ubyte.gz"));
  d.test_labels = load_idx_labels(file("t10k-labels-idx1-ubyte.gz"));
  if (d.train_labels.size() != d.train_images.count || d.test_labels.size() != d.test_images.count)
    throw gflow::parse_error(dir, "image and label counts differ (train " + std::to_string(d.train_images.count) + " images, " +
                                      std::to_string(d.train_labels.size()) + " labels; test " + std::to_string(d.test_images.count) +
                                      " images, " + std::to_string(d.test_labels.size()) + " labels).",
                             reinstall_fix);
  if (train_limit > 0 && train_limit < d.train_images.count) {
    d.train_images.count = train_limit;
    d.train_images.pixels.resize(train_limit * 28 * 28);
    d.train_labels.resize(train_limit);
  }
  return d;
}

}  // namespace trainer
