// The C++ side of tests/python's bitwise check: the same gradients through gflow::Exchanger
// directly (spans written by hand, ready() in reverse layout order), the views written to
// <dir>/<composition>.<P>.<rank>.bin after every iteration. tests/python/test_gflow_torch.py
// makes the same gradients with autograd through gflow.torch and compares the bytes.
//   mpiexec -n P gflow_python_reference <dir>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/policies/csc.hpp>
#include <gflow/policies/topk.hpp>
#include <gflow/transport/mpi.hpp>

namespace {

// The test layout and the gradient formula, as in test_gflow_torch.py (exact in float32).
const std::vector<std::vector<std::size_t>> shapes = {{5, 3}, {3}, {7, 4}, {4}, {300}};
float gradient(int rank, int it, std::size_t i, std::size_t j) {
  const long v = (static_cast<long>(rank) * 131 + it * 71 + static_cast<long>(i) * 37 + static_cast<long>(j) * 13) % 1999 - 999;
  return static_cast<float>(v) / 64.0f;
}
constexpr int iterations = 4;

template <class Exchange>
void run(gflow::mpi::transport& t, const std::string& dir, const std::string& name) {
  std::vector<gflow::tensor_desc> tensors;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    std::size_t n = 1;
    for (std::size_t d : shapes[i]) n *= d;
    tensors.push_back({"p" + std::to_string(i), shapes[i], n});
  }
  typename Exchange::template on<gflow::mpi::transport> ex(t, gflow::Layout(tensors));
  std::ofstream out(dir + "/" + name + "." + std::to_string(t.size()) + "." + std::to_string(t.rank()) + ".bin", std::ios::binary);
  for (int it = 0; it < iterations; ++it) {
    for (std::size_t i = shapes.size(); i-- > 0;) {
      auto v = ex.view(i);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = gradient(t.rank(), it, i, j);
      ex.ready(i);
    }
    (void)ex.finish();
    for (std::size_t i = 0; i < shapes.size(); ++i) out.write(reinterpret_cast<const char*>(ex.view(i).data()), static_cast<std::streamsize>(ex.view(i).size_bytes()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflow::mpi::environment env(argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpiexec -n P %s <output directory>\n", argv[0]);
    return 2;
  }
  gflow::mpi::transport t;
  const std::string dir = argv[1];
  run<gflow::Exchanger<>>(t, dir, "dense");
  run<gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<4 << 20>, gflow::Sparsifier<gflow::TopK<0.01>>, gflow::Overlap<gflow::Funneled>>>(
      t, dir, "fp16+fusion=4MiB+topk=0.01+funneled");
  run<gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.01>>>>(t, dir, "gtopk=0.01");
  run<gflow::Exchanger<gflow::Sparsifier<gflow::CSC<4096, 15>>>>(t, dir, "csc=4096:15");
  run<gflow::Exchanger<gflow::Precision<gflow::bfloat16>>>(t, dir, "bf16");
  run<gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.01>>>>(t, dir, "oktopk=0.01");
  if (t.size() >= 2)  // groups of 2 need 2 ranks (at 1 rank the CUDA tests skip this composition)
    run<gflow::Exchanger<gflow::Fusion<4 << 20>, gflow::Topology<gflow::Hierarchical<2>>>>(t, dir, "fusion=4MiB+hier=2");
  return 0;
}
