#pragma once
// What the host tests run on, and the compositions they instantiate: one list, so that a
// composition is added here (and refused in tests/compile_fail), not in each file. A list of
// supported combinations, not their cartesian product (CONVENTIONS, Tests). Files that need a
// composition with numbers chosen for one case (e.g. CSC<4, 50> on a 16-element layout) keep their
// own spelling; these lists are for the "every X" loops.
#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

namespace gflow_test {

using mock_t = gflow::mock::transport;
using inproc_t = gflow::inproc::transport;
template <class E>
using on_mock = typename E::template on<mock_t>;
template <class E>
using on_inproc = typename E::template on<inproc_t>;

}  // namespace gflow_test
