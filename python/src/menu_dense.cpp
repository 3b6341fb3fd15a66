// The module's menu, part 1: dense exchanges in each precision and fusion setting (port.hpp).
// The menu is split over several translation units so that a parallel build compiles it in parts.
#include "port.hpp"

GFLOW_PYTHON_COMPOSITION(dense, gflow::Sparsifier<gflow::None>);
GFLOW_PYTHON_COMPOSITION(fp16, gflow::Precision<gflow::half>);
GFLOW_PYTHON_COMPOSITION(bf16, gflow::Precision<gflow::bfloat16>);
GFLOW_PYTHON_COMPOSITION(fusion, gflow::Fusion<4 << 20>);
GFLOW_PYTHON_COMPOSITION(fusion_first, gflow::Fusion<25 << 20, 1 << 20>);
GFLOW_PYTHON_COMPOSITION(fusion_auto, gflow::Fusion<gflow::Auto>);
GFLOW_PYTHON_COMPOSITION(fp16_fusion, gflow::Precision<gflow::half>, gflow::Fusion<4 << 20>);
