// The module's menu, part 2: the Overlap and Topology families (port.hpp).
#include "port.hpp"

GFLOW_PYTHON_COMPOSITION(funneled, gflow::Overlap<gflow::Funneled>);
GFLOW_PYTHON_COMPOSITION(concurrent, gflow::Overlap<gflow::Concurrent<2>>);
GFLOW_PYTHON_COMPOSITION(chained, gflow::Overlap<gflow::Chained>);
GFLOW_PYTHON_COMPOSITION(fusion_funneled, gflow::Fusion<4 << 20>, gflow::Overlap<gflow::Funneled>);
GFLOW_PYTHON_COMPOSITION(hier, gflow::Fusion<4 << 20>, gflow::Topology<gflow::Hierarchical<2>>);
GFLOW_PYTHON_COMPOSITION(hybrid, gflow::Precision<gflow::half>, gflow::Fusion<4 << 20>, gflow::Topology<gflow::Hybrid<1 << 20, 2>>);
