// The module's menu: compositions by canonical name (port.hpp), and the name grammar.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "port.hpp"

namespace gflow::python {
namespace {

std::vector<menu_entry>& entries() {
  static std::vector<menu_entry> e;  // filled by the registrars at static initialisation
  return e;
}

std::string trim_lower(std::string s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "4MiB", "4mib", "4m", "4194304" -> bytes; false when it is not a size.
bool parse_bytes(const std::string& s, std::size_t& out) {
  std::size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0 || i > 15) return false;
  std::size_t v = std::stoull(s.substr(0, i));
  const std::string unit = s.substr(i);
  if (unit.empty() || unit == "b") out = v;
  else if (unit == "k" || unit == "kib" || unit == "kb") out = v << 10;
  else if (unit == "m" || unit == "mib" || unit == "mb") out = v << 20;
  else if (unit == "g" || unit == "gib" || unit == "gb") out = v << 30;
  else return false;
  return true;
}

// One '+'-separated token, lower case: its family rank (precision 0 ... overlap 4, sharding 5, unknown 6)
// and its canonical spelling ("" for a family default).
std::pair<int, std::string> canonical_token(const std::string& t) {
  const auto eq = t.find('=');
  const std::string key = t.substr(0, eq), val = eq == std::string::npos ? "" : t.substr(eq + 1);
  auto sizes = [&](const std::string& v, std::string& out) {  // "a:b" or "a" with a a size
    std::size_t b = 0;
    const auto colon = v.find(':');
    if (!parse_bytes(v.substr(0, colon), b)) return false;
    out = bytes_name(b) + (colon == std::string::npos ? "" : v.substr(colon));
    return true;
  };
  if (t == "fp32") return {0, ""};
  if (t == "fp16" || t == "bf16") return {0, t};
  if (key == "fusion") {
    if (val == "auto") return {1, "fusion=auto"};
    const auto comma = val.find(",first=");
    std::string a, b;
    if (sizes(val.substr(0, comma), a) && (comma == std::string::npos || sizes(val.substr(comma + 7), b)))
      return {1, "fusion=" + a + (b.empty() || b == "0B" ? "" : ",first=" + b)};
    return {1, t};
  }
  if (t == "dense") return {2, ""};
  if (key == "topk" || key == "gtopk" || key == "oktopk") {
    char* end = nullptr;
    const double d = std::strtod(val.c_str(), &end);
    if (!val.empty() && end && *end == '\0') return {2, key + "=" + number_name(d)};
    return {2, t};
  }
  if (key == "csc") return {2, t};
  if (t == "ring") return {3, ""};
  if (key == "hier" || key == "hierarchical") return {3, "hier=" + val};
  if (key == "hybrid") {
    std::string a;
    if (sizes(val, a)) return {3, "hybrid=" + a};
    return {3, t};
  }
  if (t == "none") return {4, ""};
  if (t == "funneled" || t == "chained" || key == "concurrent") return {4, t};
  if (t == "shard" || t == "reducescatter" || t == "reduce_scatter") return {5, "shard"};
  return {6, t};
}

}  // namespace

std::string bytes_name(std::size_t b) {
  if (b != 0 && b % (std::size_t{1} << 30) == 0) return std::to_string(b >> 30) + "GiB";
  if (b != 0 && b % (std::size_t{1} << 20) == 0) return std::to_string(b >> 20) + "MiB";
  if (b != 0 && b % (std::size_t{1} << 10) == 0) return std::to_string(b >> 10) + "KiB";
  return std::to_string(b) + "B";
}

std::string number_name(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string canonical_name(const std::string& name) {
  std::vector<std::pair<int, std::string>> tokens;
  std::string s = trim_lower(name);
  std::size_t start = 0;
  while (start <= s.size()) {
    const auto plus = s.find('+', start);
    const std::string t = s.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
    if (!t.empty()) {
      auto c = canonical_token(t);
      if (!c.second.empty()) tokens.push_back(std::move(c));
    }
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  std::stable_sort(tokens.begin(), tokens.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [rank, t] : tokens) out += (out.empty() ? "" : "+") + t;
  return out.empty() ? "dense" : out;
}

const char* space_name(space s) {
  switch (s) {
    case space::host: return "host memory";
    case space::device_mpi: return "CUDA over MPI";
    case space::device_nccl: return "CUDA over NCCL";
  }
  return "?";
}

unsigned menu_entry::spaces_mask() const {
  unsigned m = 0;
  for (std::size_t s = 0; s < spaces; ++s)
    if (make[s]) m |= 1u << s;
  return m;
}

void register_composition(const std::string& name, const std::string& policies, space s, factory f) {
  const std::string key = canonical_name(name);
  for (menu_entry& e : entries())
    if (canonical_name(e.name) == key) {  // the same composition in another space, or listed twice (an alias of a menu entry)
      if (!e.make[static_cast<std::size_t>(s)]) e.make[static_cast<std::size_t>(s)] = f;
      return;
    }
  menu_entry e{name, policies, {}};
  e.make[static_cast<std::size_t>(s)] = f;
  entries().push_back(std::move(e));
}

const std::vector<menu_entry>& menu() { return entries(); }

const menu_entry& find_composition(const std::string& name, space s) {
  const std::string key = canonical_name(name);
  const auto si = static_cast<std::size_t>(s);
  for (const menu_entry& e : entries())
    if (canonical_name(e.name) == key && e.make[si]) return e;
  std::vector<std::string> names;
  for (const menu_entry& e : entries())
    if (e.make[si]) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  const bool elsewhere = std::any_of(entries().begin(), entries().end(), [&](const menu_entry& e) { return canonical_name(e.name) == key; });
  throw invalid_argument("composition",
                         "'" + name + "' (read as '" + key + "') is not compiled into this library for " + space_name(s) +
                             (elsewhere ? " (it is for another memory space)" : "") + ". Available there: " + (list.empty() ? "none" : list) + ".",
                         "pass one of those names (tokens in any order, '+' between them), or compile the composition into the library "
                         "with gflow_add_python_composition(NAME ... POLICIES ...) in CMake (docs/GUIDE.md, \"Python\").");
}

namespace {
device_support*& device_slot() {
  static device_support* d = nullptr;
  return d;
}
}  // namespace
void set_device_support(device_support* d) { device_slot() = d; }
device_support* get_device_support() { return device_slot(); }

}  // namespace gflow::python
