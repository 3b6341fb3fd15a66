// The checkpoint stream's hash (gflow/detail/support/checkpoint.hpp): independent of how the bytes are split.
#include <doctest/doctest.h>

#include <gflow/detail/support/checkpoint.hpp>

#include <algorithm>
#include <cstddef>
#include <string>

using namespace gflow;

TEST_CASE("checkpoint: stream_hash is independent of how the bytes are split") {
  std::string data(1000, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  detail::stream_hash whole;
  whole.update(data.data(), data.size());
  for (std::size_t piece : {1, 3, 7, 8, 9, 64, 999}) {
    detail::stream_hash h;
    for (std::size_t i = 0; i < data.size(); i += piece) h.update(data.data() + i, std::min(piece, data.size() - i));
    CHECK(h.value() == whole.value());
  }
  detail::stream_hash shorter;
  shorter.update(data.data(), data.size() - 1);
  CHECK(shorter.value() != whole.value());
}
