#pragma once
// gflow::mpi, part 6 of 6: MPI's lifetime as an object, and where a process sits on its node.
#include "../../error.hpp"
#include "check.hpp"

namespace gflow::mpi {

/// MPI_Init_thread / MPI_Finalize as an object. Requests MPI_THREAD_MULTIPLE and accepts what
/// the library provides (see provided()). If MPI was already initialised by someone else, it
/// does nothing and leaves finalising to them.
class environment {
 public:
  environment() : environment(nullptr, nullptr) {}
  environment(int& argc, char**& argv) : environment(&argc, &argv) {}
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  ~environment() {
    if (!owner_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  /// The thread level MPI provides: MPI_THREAD_SINGLE, _FUNNELED, _SERIALIZED or _MULTIPLE.
  [[nodiscard]] int provided() const noexcept { return provided_; }
  [[nodiscard]] bool thread_multiple() const noexcept { return provided_ >= MPI_THREAD_MULTIPLE; }
  /// True when this object initialised MPI and will finalise it.
  [[nodiscard]] bool owner() const noexcept { return owner_; }

 private:
  environment(int* argc, char*** argv) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
      throw usage_error("environment", "MPI was already finalized; it cannot be initialised again.",
                        "create one gflow::mpi::environment at the start of main() and keep it alive until the end.");
    if (initialized) {
      detail::check(MPI_Query_thread(&provided_), "MPI_Query_thread", "in gflow::mpi::environment");
      return;
    }
    detail::check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_), "MPI_Init_thread", "in gflow::mpi::environment",
                  "check the MPI installation and launch the program with mpiexec.");
    owner_ = true;
  }

  int provided_ = MPI_THREAD_SINGLE;
  bool owner_ = false;
};

/// This process among the ranks of `comm` on its node (MPI_COMM_TYPE_SHARED).
struct node_place {
  int rank = 0;  // among the node's ranks
  int size = 1;  // the node's ranks
};
/// Where this process sits on its node. Collective over comm.
inline node_place node_rank(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  detail::check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type", "in gflow::mpi::node_rank");
  node_place p;
  const int rc1 = MPI_Comm_rank(node, &p.rank), rc2 = MPI_Comm_size(node, &p.size);
  MPI_Comm_free(&node);
  detail::check(rc1 != MPI_SUCCESS ? rc1 : rc2, "MPI_Comm_rank / MPI_Comm_size", "in gflow::mpi::node_rank");
  return p;
}

}  // namespace gflow::mpi
