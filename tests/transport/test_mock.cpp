// The mock transport (gflow/transport/mock.hpp): it records every call and simulates identical ranks.
#include <doctest/doctest.h>

#include <gflow/detail/kernels/cast.hpp>
#include <gflow/transport/mock.hpp>

#include <cstdint>
#include <vector>

using gflow::reduce_op;

TEST_CASE("mock transport records every call and simulates identical ranks") {
  gflow::mock::transport m(4, 1);
  float v[3] = {1, 2, 3};
  m.all_reduce(v, 3, reduce_op::sum);
  CHECK(v[2] == 12.0f);
  gflow::half h[2] = {gflow::detail::kernels::to_half(0.5f), gflow::detail::kernels::to_half(1.0f)};
  auto r = m.iall_reduce(h, 2, reduce_op::sum);
  m.wait(r);
  CHECK(gflow::detail::kernels::to_float(h[0]) == 2.0f);
  std::int32_t g[8];
  std::int32_t mine[2] = {7, 8};
  m.all_gather(mine, g, 2);
  CHECK(g[6] == 7);
  m.send(v, 3, 2);
  m.calls().inbox.push_back(std::vector<unsigned char>(sizeof(float), 0));
  m.recv(v, 1, 0);
  auto sub = m.split(1, 0);
  sub.broadcast(v, 1, 0);
  const auto& rec = m.calls().records;
  REQUIRE(rec.size() == 8);
  CHECK(rec[0].kind == gflow::mock::op::all_reduce);
  CHECK(rec[0].bytes == 12);
  CHECK(rec[1].type == gflow::dtype::f16);
  CHECK(rec[1].async);
  CHECK(rec[2].kind == gflow::mock::op::wait);
  CHECK(rec[3].kind == gflow::mock::op::all_gather);
  CHECK(rec[4].peer == 2);
  CHECK(rec[5].kind == gflow::mock::op::recv);
  CHECK(rec[6].kind == gflow::mock::op::split);
  CHECK(rec[7].group == "world/1");
  m.calls().inbox.push_back(std::vector<unsigned char>(3, 0));
  CHECK_THROWS_AS(m.recv(v, 1, 0), gflow::mismatch_error);
}
