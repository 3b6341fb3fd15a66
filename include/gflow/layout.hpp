#pragma once
// Layout: the trainer's gradient tensors, in forward order (the order the model declares
// them). Backward produces them in reverse, and the pool (plan/pool.hpp) stores them in that
// generation order. A layout comes from a list of sizes or from a .tsv file with the columns
//   name <TAB> shape <TAB> numel      (shape as 64x3x7x7; '#' lines are comments)
// as in bench/layouts/*.tsv.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "error.hpp"

namespace gflow {

struct tensor_desc {
  std::string name;
  std::vector<std::size_t> shape;
  std::size_t numel = 0;
};

class Layout {
 public:
  Layout() = default;

  /// From element counts in forward order; tensors are named t0, t1, ...
  static Layout from_sizes(const std::vector<std::size_t>& numels) {
    std::vector<tensor_desc> ts;
    ts.reserve(numels.size());
    for (std::size_t i = 0; i < numels.size(); ++i)
      ts.push_back({fmt::format("t{}", i), {numels[i]}, numels[i]});
    return Layout(std::move(ts));
  }
  static Layout from_sizes(std::initializer_list<std::size_t> numels) {
    return from_sizes(std::vector<std::size_t>(numels));
  }

  explicit Layout(std::vector<tensor_desc> tensors) : tensors_(std::move(tensors)) { validate(); }

  /// Parses the .tsv text; `source` names the file in error messages.
  static Layout parse_tsv(std::string_view text, std::string_view source = "<text>") {
    std::vector<tensor_desc> ts;
    std::size_t line_no = 0;
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || line.front() == '#') {
        if (end == text.size()) break;
        continue;
      }
      auto where = [&] { return fmt::format("{}:{}", source, line_no); };
      std::string_view cols[3];
      std::size_t ncol = 0;
      std::size_t c = 0;
      while (true) {
        std::size_t tab = line.find('\t', c);
        if (ncol == 3) throw parse_error(where(), "more than 3 tab-separated columns.", "write 'name<TAB>shape<TAB>numel'.");
        cols[ncol++] = line.substr(c, tab == std::string_view::npos ? std::string_view::npos : tab - c);
        if (tab == std::string_view::npos) break;
        c = tab + 1;
      }
      if (ncol != 3)
        throw parse_error(where(), fmt::format("expected 3 tab-separated columns (name, shape, numel), found {}.", ncol),
                          "write 'name<TAB>shape<TAB>numel', e.g. 'fc.weight\t10x784\t7840'.");
      tensor_desc t;
      t.name = std::string(cols[0]);
      if (t.name.empty()) throw parse_error(where(), "empty tensor name.", "give every row a name in column 1.");
      std::size_t prod = 1;
      std::string_view shape = cols[1];
      std::size_t s = 0;
      while (true) {
        std::size_t x = shape.find('x', s);
        std::string_view dim = shape.substr(s, x == std::string_view::npos ? std::string_view::npos : x - s);
        std::size_t d = parse_count(dim, where(), "shape");
        t.shape.push_back(d);
        if (d != 0 && prod > SIZE_MAX / d) throw parse_error(where(), "shape product overflows.", "check the shape column.");
        prod *= d;
        if (x == std::string_view::npos) break;
        s = x + 1;
      }
      t.numel = parse_count(cols[2], where(), "numel");
      if (t.numel != prod)
        throw parse_error(where(), fmt::format("numel {} does not match the shape's product {}.", t.numel, prod),
                          "make column 3 the product of the dimensions in column 2.");
      ts.push_back(std::move(t));
      if (end == text.size()) break;
    }
    if (ts.empty()) throw parse_error(std::string(source), "the layout file holds no tensor rows.", "add rows 'name<TAB>shape<TAB>numel'.");
    return Layout(std::move(ts));
  }

  static Layout from_tsv(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw invalid_argument("layout path", "cannot open '" + path + "'.", "pass an existing .tsv file (see bench/layouts/).");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_tsv(ss.str(), path);
  }

  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  [[nodiscard]] const tensor_desc& operator[](std::size_t i) const noexcept { return tensors_[i]; }
  [[nodiscard]] const std::vector<tensor_desc>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] std::size_t total_numel() const noexcept {
    std::size_t n = 0;
    for (const auto& t : tensors_) n += t.numel;
    return n;
  }

 private:
  static std::size_t parse_count(std::string_view s, const std::string& where, const char* column) {
    if (s.empty()) throw parse_error(where, std::string("empty ") + column + " field.", "write a non-negative integer.");
    std::size_t v = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9')
        throw parse_error(where, std::string(column) + " field '" + std::string(s) + "' is not a non-negative integer.", "write digits only, e.g. 64x3x7x7 or 9408.");
      const std::size_t digit = static_cast<std::size_t>(ch - '0');
      if (v > (SIZE_MAX - digit) / 10) throw parse_error(where, std::string(column) + " value overflows.", "check the number.");
      v = v * 10 + digit;
    }
    return v;
  }

  void validate() const {
    if (tensors_.empty())
      throw invalid_argument("layout", "the layout is empty: there is no gradient to exchange.", "describe at least one tensor.");
    // The pool holds every tensor as floats: its byte size must be a valid object size, so that
    // no offset or byte count computed from the layout wraps around (tests/fuzz regression).
    constexpr std::size_t max_pool = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(float);
    std::size_t total = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].numel == 0)
        throw invalid_argument("layout", fmt::format("tensor {} ('{}') has zero elements.", i, tensors_[i].name),
                               "leave tensors without gradients out of the layout.");
      if (tensors_[i].numel > max_pool - total)
        throw invalid_argument("layout", fmt::format("tensor {} ('{}') brings the pool to more than "
                                             "{} elements, more floats than one array can hold.", i, tensors_[i].name, max_pool),
                               "describe the tensors of one model (check the numel column for a typo).");
      total += tensors_[i].numel;
    }
  }

  std::vector<tensor_desc> tensors_;
};

}  // namespace gflow
