#include <doctest/doctest.h>

#include <gflow/layout.hpp>

#include <string>

using gflow::Layout;

TEST_CASE("layout from sizes names tensors and counts elements") {
  auto l = Layout::from_sizes({3, 5, 7});
  REQUIRE(l.size() == 3);
  CHECK(l[0].name == "t0");
  CHECK(l[2].numel == 7);
  CHECK(l.total_numel() == 15);
}

TEST_CASE("layout rejects an empty list and zero-size tensors") {
  CHECK_THROWS_AS(Layout::from_sizes(std::vector<std::size_t>{}), gflow::invalid_argument);
  try {
    (void)Layout::from_sizes({4, 0, 2});
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "layout");
    CHECK(std::string(e.what()).find("tensor 1 ('t1') has zero elements") != std::string::npos);
    CHECK(std::string(e.what()).find("Fix:") != std::string::npos);
  }
}

TEST_CASE("tsv parser reads name, shape, numel and skips comments") {
  auto l = Layout::parse_tsv("# model\n# name\tshape\tnumel\nconv.weight\t64x3x7x7\t9408\r\nbn.bias\t64\t64\n\n", "x.tsv");
  REQUIRE(l.size() == 2);
  CHECK(l[0].name == "conv.weight");
  CHECK(l[0].shape == std::vector<std::size_t>{64, 3, 7, 7});
  CHECK(l[1].numel == 64);
}

TEST_CASE("tsv parser reports the file, line and fix for bad rows") {
  auto msg = [](const char* text) -> std::string {
    try {
      (void)Layout::parse_tsv(text, "bad.tsv");
    } catch (const gflow::parse_error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(msg("a\t2x2\t5\n").find("bad.tsv:1") != std::string::npos);
  CHECK(msg("a\t2x2\t5\n").find("does not match the shape's product 4") != std::string::npos);
  CHECK(msg("# c\na\t2\n").find("bad.tsv:2") != std::string::npos);
  CHECK(msg("a\t2\t2\textra\n").find("more than 3") != std::string::npos);
  CHECK(msg("a\t2y\t2\n").find("not a non-negative integer") != std::string::npos);
  CHECK(msg("a\t2\t-2\n").find("not a non-negative integer") != std::string::npos);
  CHECK(msg("\tx\t1\n").find("empty") != std::string::npos);
  CHECK(msg("# only comments\n").find("no tensor rows") != std::string::npos);
  CHECK(msg("a\t99999999999999999999999\t1\n").find("overflows") != std::string::npos);
  // a zero-size row parses but the layout rejects it
  CHECK_THROWS_AS(Layout::parse_tsv("a\t0\t0\n"), gflow::invalid_argument);
  CHECK_THROWS_AS(Layout::from_tsv("/nonexistent/model.tsv"), gflow::invalid_argument);
}

TEST_CASE("the shipped model layouts load with their documented sizes") {
  struct expect { const char* name; std::size_t tensors, params; };
  for (auto e : {expect{"resnet50", 161, 25557032}, expect{"alexnet", 16, 61100840}, expect{"vgg16", 32, 138357544},
                 expect{"bert_base", 199, 0}, expect{"gpt2_small", 148, 0}}) {
    CAPTURE(e.name);
    auto l = Layout::from_tsv(std::string(GFLOW_LAYOUT_DIR) + "/" + e.name + ".tsv");
    CHECK(l.size() == e.tensors);
    if (e.params) CHECK(l.total_numel() == e.params);
  }
}
