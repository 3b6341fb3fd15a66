// The module's menu, part 4: CSC at the paper's and the CNN trainer's chunk sizes (port.hpp).
#include "port.hpp"

GFLOW_PYTHON_COMPOSITION(csc, gflow::Sparsifier<gflow::CSC<32768, 15>>);
GFLOW_PYTHON_COMPOSITION(csc_4096, gflow::Sparsifier<gflow::CSC<4096, 15>>);
GFLOW_PYTHON_COMPOSITION(csc_fusion_funneled, gflow::Sparsifier<gflow::CSC<4096, 15>>, gflow::Fusion<4 << 20>, gflow::Overlap<gflow::Funneled>);
