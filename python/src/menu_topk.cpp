// The module's menu, part 3: TopK and GTopK at the documented densities (port.hpp).
#include "port.hpp"

GFLOW_PYTHON_COMPOSITION(topk, gflow::Sparsifier<gflow::TopK<0.01>>);
GFLOW_PYTHON_COMPOSITION(topk_001, gflow::Sparsifier<gflow::TopK<0.001>>);
GFLOW_PYTHON_COMPOSITION(gtopk, gflow::Sparsifier<gflow::GTopK<0.01>>);
GFLOW_PYTHON_COMPOSITION(gtopk_001, gflow::Sparsifier<gflow::GTopK<0.001>>);
GFLOW_PYTHON_COMPOSITION(fp16_topk_funneled, gflow::Precision<gflow::half>, gflow::Fusion<4 << 20>, gflow::Sparsifier<gflow::TopK<0.01>>,
                         gflow::Overlap<gflow::Funneled>);
