// The trainer's policy-independent parts: IDX loading (real files and corrupt ones written
// here with zlib) and option parsing. Every bad input must be a typed gflow error naming the
// file or flag and the fix.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gflow/error.hpp>
#include <gflow/detail/plan/pool.hpp>

#include "trainer.hpp"

namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("gflow_trainer_test_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void put32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
}

std::string write_gz(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
  return p.string();
}

// An IDX3 file: magic, n, rows, cols, then `data` bytes (n*rows*cols unless told otherwise).
std::vector<std::uint8_t> idx3(std::uint32_t magic, std::uint32_t n, std::uint32_t rows, std::uint32_t cols, std::size_t data) {
  std::vector<std::uint8_t> b;
  put32(b, magic);
  put32(b, n);
  put32(b, rows);
  put32(b, cols);
  b.resize(b.size() + data, 7);
  return b;
}

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no " << typeid(E).name() << " was thrown");
  return {};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("IDX loader: a well-formed file round-trips") {
  temp_dir d;
  auto bytes = idx3(0x803, 2, 28, 28, 2 * 784);
  bytes[16 + 784] = 200;  // first pixel of the second image
  const auto im = trainer::load_idx_images(write_gz(d.path / "ok.gz", bytes));
  CHECK(im.count == 2);
  CHECK(im.rows == 28);
  CHECK(im.pixels.size() == 2 * 784);
  CHECK(im.pixels[784] == 200);
  std::vector<std::uint8_t> lb;
  put32(lb, 0x801);
  put32(lb, 3);
  lb.insert(lb.end(), {9, 0, 4});
  CHECK(trainer::load_idx_labels(write_gz(d.path / "l.gz", lb)) == std::vector<std::uint8_t>{9, 0, 4});
}

TEST_CASE("IDX loader: every defect is a typed error naming the file and the fix") {
  temp_dir d;
  SUBCASE("missing file names the Debian package") {
    const auto m = error_of<gflow::invalid_argument>([&] { trainer::load_idx_images((d.path / "nope.gz").string()); });
    CHECK(has(m, "in '--data'"));
    CHECK(has(m, "nope.gz"));
    CHECK(has(m, "apt-get install dataset-fashion-mnist"));
  }
  SUBCASE("bad magic") {
    const auto p = write_gz(d.path / "magic.gz", idx3(0x801, 1, 28, 28, 784));
    const auto m = error_of<gflow::parse_error>([&] { trainer::load_idx_images(p); });
    CHECK(has(m, "magic.gz"));
    CHECK(has(m, "magic number 0x00000801"));
    CHECK(has(m, "reinstall"));
  }
  SUBCASE("wrong dimensions") {
    const auto p = write_gz(d.path / "dims.gz", idx3(0x803, 1, 32, 32, 1024));
    CHECK(has(error_of<gflow::parse_error>([&] { trainer::load_idx_images(p); }), "images are 32x32; the model expects 28x28"));
  }
  SUBCASE("short data") {
    const auto p = write_gz(d.path / "short.gz", idx3(0x803, 3, 28, 28, 2 * 784 + 5));
    CHECK(has(error_of<gflow::parse_error>([&] { trainer::load_idx_images(p); }), "truncated: the header announces 2352 data bytes, the file holds 1573"));
  }
  SUBCASE("trailing data") {
    const auto p = write_gz(d.path / "long.gz", idx3(0x803, 1, 28, 28, 785));
    CHECK(has(error_of<gflow::parse_error>([&] { trainer::load_idx_images(p); }), "trailing bytes"));
  }
  SUBCASE("shorter than a header") {
    const auto p = write_gz(d.path / "tiny.gz", {0, 0, 8});
    CHECK(has(error_of<gflow::parse_error>([&] { trainer::load_idx_images(p); }), "shorter than an IDX header"));
  }
  SUBCASE("corrupt gzip stream") {
    auto bytes = idx3(0x803, 4, 28, 28, 4 * 784);
    for (std::size_t i = 16; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 31);
    const auto p = write_gz(d.path / "bad.gz", bytes);
    std::vector<char> raw(fs::file_size(p));
    {
      std::FILE* f = std::fopen(p.c_str(), "rb");
      REQUIRE(std::fread(raw.data(), 1, raw.size(), f) == raw.size());
      std::fclose(f);
    }
    for (std::size_t i = 20; i < raw.size() - 12; i += 7) raw[i] = static_cast<char>(~raw[i]);  // damage the deflate stream
    std::FILE* f = std::fopen(p.c_str(), "wb");
    std::fwrite(raw.data(), 1, raw.size(), f);
    std::fclose(f);
    const auto m = error_of<gflow::parse_error>([&] { trainer::load_idx_images(p); });
    CHECK(has(m, "bad.gz"));
  }
  SUBCASE("label out of range") {
    std::vector<std::uint8_t> lb;
    put32(lb, 0x801);
    put32(lb, 2);
    lb.insert(lb.end(), {3, 12});
    const auto p = write_gz(d.path / "lab.gz", lb);
    CHECK(has(error_of<gflow::parse_error>([&] { trainer::load_idx_labels(p); }), "label 1 is 12"));
  }
}

// Without dataset-fashion-mnist (scripts/install-deps.sh installs it) the case reports itself
// skipped (doctest::skip), never passed.
TEST_CASE("Fashion-MNIST from the Debian package" *
          doctest::skip(!fs::exists(std::string(trainer::default_data_dir) + "/train-images-idx3-ubyte.gz"))) {
  const auto d = trainer::load_fashion_mnist(trainer::default_data_dir, 1000);
  CHECK(d.train_images.count == 1000);
  CHECK(d.train_labels.size() == 1000);
  CHECK(d.test_images.count == 10000);
  CHECK(d.test_labels.size() == 10000);
  CHECK(d.train_labels[0] == 9);  // the first training image is an ankle boot
}

TEST_CASE("options: defaults, values and bad input") {
  auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), "train");
    return trainer::parse_cli(static_cast<int>(args.size()), args.data());
  };
  const auto o = parse({"--lr", "0.1", "--momentum", "0", "--epochs", "2", "--loss-scale", "1024", "--lars", "0.02"});
  CHECK(o.lr == doctest::Approx(0.1));
  CHECK(o.momentum == 0.0f);
  CHECK(o.epochs == 2);
  CHECK(o.loss_scale == trainer::loss_scale_mode::fixed);
  CHECK(o.loss_scale_value == 1024.0f);
  CHECK(o.lars == doctest::Approx(0.02));
  CHECK(parse({"--help"}).help);

  using E = gflow::invalid_argument;
  CHECK(has(error_of<E>([&] { parse({"--lr", "-0.1"}); }), "in '--lr': the learning rate must be non-negative"));
  CHECK(has(error_of<E>([&] { parse({"--momentum", "1"}); }), "in '--momentum': the momentum must lie in [0, 1)"));
  CHECK(has(error_of<E>([&] { parse({"--momentum", "1.5"}); }), "Fix: pass e.g. --momentum 0.9."));
  CHECK(has(error_of<E>([&] { parse({"--learning-rate", "0.1"}); }), "in '--learning-rate': unknown option"));
  CHECK(has(error_of<E>([&] { parse({"--epochs", "0"}); }), "in '--epochs'"));
  CHECK(has(error_of<E>([&] { parse({"--epochs", "two"}); }), "not a whole number"));
  CHECK(has(error_of<E>([&] { parse({"--lr", "nan"}); }), "not a finite number"));
  CHECK(has(error_of<E>([&] { parse({"--lr"}); }), "needs a value"));
  CHECK(has(error_of<E>([&] { parse({"--loss-scale", "-4"}); }), "must be positive"));
}

TEST_CASE("options: --verify-replicas N (issue 23)") {
  auto parse = [](std::vector<const char*> args) {
    args.insert(args.begin(), "train");
    return trainer::parse_cli(static_cast<int>(args.size()), args.data());
  };
  CHECK(parse({}).verify_replicas == 0);  // off by default
  const auto o = parse({"--lr", "0.1", "--verify-replicas", "25", "--epochs", "2"});
  CHECK(o.verify_replicas == 25);
  CHECK(o.epochs == 2);
  CHECK(parse({"--verify-replicas", "0"}).verify_replicas == 0);
  using E = gflow::invalid_argument;
  CHECK(has(error_of<E>([&] { parse({"--verify-replicas", "-1"}); }), "in '--verify-replicas': '-1' is not a whole number >= 0."));
  CHECK(has(error_of<E>([&] { parse({"--verify-replicas"}); }), "in '--verify-replicas': the option needs a value. Fix: write e.g. --verify-replicas 100"));
}

TEST_CASE("pool_order_layout: the tensors in buffer order") {
  const auto l = trainer::mlp_layout();
  const auto plan = gflow::detail::plan::plan_pool(l);
  const gflow::Layout p = trainer::pool_order_layout(l, plan.offset);
  REQUIRE(p.size() == l.size());
  for (std::size_t k = 0; k < p.size(); ++k) CHECK(p[k].name == l[plan.tensor_at[k]].name);  // generation order: fc3.bias first
  CHECK(p[0].name == "fc3.bias");
  CHECK(p.total_numel() == l.total_numel());
}

TEST_CASE("the MLP's layout") {
  const auto l = trainer::mlp_layout();
  REQUIRE(l.size() == 6);
  CHECK(l[0].numel == 256 * 784);
  CHECK(l[5].numel == 10);
  CHECK(l.total_numel() == 235146);
}
