// gflow._gflow: the pybind11 module under gflow.torch (python/gflow). The only translation unit
// that includes pybind11; it includes no torch: gradients reach Python as a NumPy array over the
// exchanger's pool (no copy), which gflow.torch turns into tensors with torch.from_numpy.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gflow/replicas.hpp>

#include "port.hpp"

namespace py = pybind11;
using namespace gflow;

namespace {

// MPI and the world transport, created by init() and kept until finalize() (or exit).
struct world {
  mpi::environment env;
  mpi::transport comm;
};
std::unique_ptr<world>& the_world() {
  static std::unique_ptr<world> w;
  return w;
}
mpi::transport& comm() {
  if (!the_world())
    throw usage_error("init", "gflow.torch.init() has not been called in this process.",
                      "call gflow.torch.init() once, before rank(), size(), broadcasts or DistributedOptimizer.");
  return the_world()->comm;
}

// An exchanger over the world transport, with the Python objects that must outlive it.
struct exchanger {
  std::unique_ptr<python::port> port;
  std::shared_ptr<timeline> trace;  // set_timeline(): kept alive while attached
};

const char* python_class(errc c) {
  switch (c) {
    case errc::invalid_argument: return "InvalidArgument";
    case errc::usage: return "UsageError";
    case errc::mismatch: return "MismatchError";
    case errc::transport: return "TransportError";
    case errc::timeout: return "TimeoutError";
    case errc::parse: return "ParseError";
  }
  return "Error";
}

// A writable, C-contiguous buffer (NumPy array over a tensor's memory).
py::buffer_info writable(const py::buffer& b, const char* what) {
  py::buffer_info info = b.request(true);
  std::size_t expect = static_cast<std::size_t>(info.itemsize);
  for (py::ssize_t d = info.ndim; d-- > 0;) {
    if (info.shape[d] != 1 && static_cast<std::size_t>(info.strides[d]) != expect)
      throw invalid_argument(what, "the buffer is not contiguous.", "pass tensor.contiguous() (gflow.torch does this for you).");
    expect *= static_cast<std::size_t>(info.shape[d]);
  }
  return info;
}

}  // namespace

PYBIND11_MODULE(_gflow, m) {
  m.doc() = "gflow's exchangers over MPI (use gflow.torch)";

  // Typed gflow errors become gflow.errors.<Class>(message, kind, subject, fix).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gflow::error& e) {
      const std::string msg = e.what();
      const auto at = msg.find(" Fix: ");
      const std::string fix = at == std::string::npos ? "" : msg.substr(at + 6);
      py::object cls = py::module_::import("gflow.errors").attr(python_class(e.code()));
      py::object exc = cls(msg, std::string(to_string(e.code())), e.subject(), fix);
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  m.def("init", [] {
    if (!the_world()) {
      auto w = std::unique_ptr<world>(new world{mpi::environment(), mpi::transport()});
      the_world() = std::move(w);
    }
  }, py::call_guard<py::gil_scoped_release>(), "MPI_Init_thread (unless MPI is initialised already) and the world transport (collective).");
  m.def("initialized", [] { return static_cast<bool>(the_world()); });
  m.def("finalize", [] { the_world().reset(); }, py::call_guard<py::gil_scoped_release>());
  m.def("abort", [](int code) { MPI_Abort(MPI_COMM_WORLD, code); }, "MPI_Abort on the world: ends every rank (a failed test must not leave the others in a collective).");
  m.def("rank", [] { return comm().rank(); });
  m.def("size", [] { return comm().size(); });

  m.def("compositions", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& e : python::menu()) out.emplace_back(e.name, e.policies);
    return out;
  }, "The compositions compiled into the module: (name, C++ policies).");
  m.def("canonical_name", &python::canonical_name);

  // Collectives on float32 / raw buffers, in place.
  m.def("broadcast_", [](const py::buffer& b, int root) {
    py::buffer_info info = writable(b, "tensor");
    const std::size_t bytes = static_cast<std::size_t>(info.size * info.itemsize);
    mpi::transport& t = comm();
    py::gil_scoped_release nogil;
    if (bytes % sizeof(float) == 0) {
      // gflow::broadcast_parameters checks count and root across ranks first (an error on every rank, no hang);
      // it moves bits, so any 4-byte-multiple dtype travels exactly.
      broadcast_parameters(t, std::span<float>(static_cast<float*>(info.ptr), bytes / sizeof(float)), root);
    } else {
      std::vector<float> padded((bytes + sizeof(float) - 1) / sizeof(float));
      std::memcpy(padded.data(), info.ptr, bytes);
      broadcast_parameters(t, std::span<float>(padded), root);
      std::memcpy(info.ptr, padded.data(), bytes);
    }
  }, py::arg("buffer"), py::arg("root") = 0);
  m.def("broadcast_bytes", [](const py::bytes& data, int root) {
    std::string s = data;
    mpi::transport& t = comm();
    {
      py::gil_scoped_release nogil;
      std::uint64_t size = s.size();
      std::vector<float> hdr(2);
      std::memcpy(hdr.data(), &size, sizeof size);
      broadcast_parameters(t, std::span<float>(hdr), root);
      std::memcpy(&size, hdr.data(), sizeof size);
      std::vector<float> buf((size + sizeof(float) - 1) / sizeof(float) + 1);
      if (t.rank() == root) std::memcpy(buf.data(), s.data(), s.size());
      broadcast_parameters(t, std::span<float>(buf), root);
      s.assign(reinterpret_cast<const char*>(buf.data()), size);
    }
    return py::bytes(s);
  }, py::arg("data"), py::arg("root") = 0);
  m.def("allreduce_average_", [](const py::buffer& b) {
    py::buffer_info info = writable(b, "tensor");
    if (info.format != py::format_descriptor<float>::format())
      throw invalid_argument("tensor", "allreduce_average_ takes float32 tensors (got format '" + info.format + "').", "pass a float32 tensor.");
    float* p = static_cast<float*>(info.ptr);
    const std::size_t n = static_cast<std::size_t>(info.size);
    mpi::transport& t = comm();
    py::gil_scoped_release nogil;
    t.all_reduce(p, n, reduce_op::sum);
    const float inv = 1.0f / static_cast<float>(t.size());
    for (std::size_t i = 0; i < n; ++i) p[i] *= inv;
  });
  m.def("verify_replicas", [](const py::buffer& b, const std::vector<std::string>& names, const std::vector<std::size_t>& sizes) {
    py::buffer_info info = writable(b, "values");
    std::vector<tensor_desc> tensors;
    for (std::size_t i = 0; i < sizes.size(); ++i) tensors.push_back({i < names.size() ? names[i] : "t" + std::to_string(i), {sizes[i]}, sizes[i]});
    Layout layout(tensors);
    mpi::transport& t = comm();
    py::gil_scoped_release nogil;
    verify_replicas(t, std::span<const float>(static_cast<const float*>(info.ptr), static_cast<std::size_t>(info.size)), layout);
  });

  py::class_<exchange_status>(m, "ExchangeStatus")
      .def_readonly("iteration", &exchange_status::iteration)
      .def_readonly("nonfinite", &exchange_status::nonfinite)
      .def_readonly("collectives", &exchange_status::collectives)
      .def_readonly("wire_bytes", &exchange_status::wire_bytes)
      .def_readonly("contributors", &exchange_status::contributors)
      .def_readonly("unused", &exchange_status::unused)
      .def("finite", &exchange_status::finite);
  py::class_<join_status>(m, "JoinStatus").def_readonly("shadowed", &join_status::shadowed).def_readonly("last_rank", &join_status::last_rank);

  py::class_<timeline, std::shared_ptr<timeline>>(m, "Timeline")
      .def(py::init<std::size_t>(), py::arg("capacity") = std::size_t{1} << 18)
      .def("start", [](timeline& tl) { tl.start(comm()); }, py::call_guard<py::gil_scoped_release>())
      .def("write", [](const timeline& tl, const std::string& path) { tl.write_chrome_trace(comm(), path); }, py::call_guard<py::gil_scoped_release>())
      .def("__len__", &timeline::size);

  py::class_<exchanger>(m, "Exchanger")
      .def(py::init([](const std::string& composition, const std::vector<std::string>& names, const std::vector<std::vector<std::size_t>>& shapes,
                       bool find_unused, bool learn_order, bool uneven_inputs, bool average, std::optional<std::size_t> threshold_bytes) {
             const python::menu_entry& e = python::find_composition(composition);
             std::vector<tensor_desc> tensors;
             for (std::size_t i = 0; i < shapes.size(); ++i) {
               std::size_t n = 1;
               for (std::size_t d : shapes[i]) n *= d;
               tensors.push_back({i < names.size() ? names[i] : "t" + std::to_string(i), shapes[i], n});
             }
             exchange_options o;
             o.find_unused = find_unused;
             o.learn_order = learn_order;
             o.uneven_inputs = uneven_inputs;
             o.average = average;
             mpi::transport& t = comm();
             py::gil_scoped_release nogil;  // collective (the consistency check; set_fusion's)
             exchanger ex{e.make(t, Layout(tensors), o), nullptr};
             if (threshold_bytes) ex.port->set_fusion(*threshold_bytes);
             return ex;
           }),
           py::arg("composition"), py::arg("names"), py::arg("shapes"), py::arg("find_unused") = false, py::arg("learn_order") = false,
           py::arg("uneven_inputs") = false, py::arg("average") = true, py::arg("threshold_bytes") = py::none())
      .def("pool", [](py::object self) {
        exchanger& x = self.cast<exchanger&>();
        return py::array_t<float>({static_cast<py::ssize_t>(x.port->pool_size())}, {static_cast<py::ssize_t>(sizeof(float))}, x.port->pool_data(), self);
      }, "The gradient pool as a float32 NumPy array over the exchanger's memory (no copy); alive as long as the array.")
      .def("offsets", [](const exchanger& x) { return x.port->offsets(); })
      .def("ready", [](exchanger& x, std::size_t i) { x.port->ready(i); }, py::call_guard<py::gil_scoped_release>())
      .def("finish", [](exchanger& x) { return x.port->finish(); }, py::call_guard<py::gil_scoped_release>())
      .def("begin_no_sync", [](exchanger& x) { x.port->begin_no_sync(); })
      .def("end_no_sync", [](exchanger& x) { x.port->end_no_sync(); })
      .def("join", [](exchanger& x, py::object step) {
             // step (a callable taking the iteration's ExchangeStatus, or None): run after each
             // shadowed iteration, with the GIL.
             std::function<void(const exchange_status&)> f;
             if (!step.is_none()) f = [&step](const exchange_status& st) {
               py::gil_scoped_acquire gil;
               step(st);
             };
             py::gil_scoped_release nogil;
             return x.port->join(f);
           }, py::arg("step") = py::none())
      .def_property_readonly("generation", [](const exchanger& x) { return x.port->generation(); })
      .def_property_readonly("iteration", [](const exchanger& x) { return x.port->iteration(); })
      .def_property_readonly("name", [](const exchanger& x) { return x.port->name(); })
      .def_property_readonly("dense", [](const exchanger& x) { return x.port->dense(); })
      .def_property_readonly("sharded", [](const exchanger& x) { return x.port->sharded(); })
      .def("shard", [](const exchanger& x) { return x.port->shard(); }, "This rank's shard: (first, end) pool elements per bucket (sharded compositions).")
      .def("gather_shards", [](exchanger& x, const py::buffer& b) {
        py::buffer_info info = writable(b, "values");
        if (info.format != py::format_descriptor<float>::format())
          throw invalid_argument("values", "gather_shards takes a float32 buffer (got format '" + info.format + "').", "pass a float32 tensor laid out like the pool.");
        float* p = static_cast<float*>(info.ptr);
        const auto n = static_cast<std::size_t>(info.size);
        py::gil_scoped_release nogil;
        x.port->gather_shards(p, n);
      }, py::arg("values"), "In place: this rank's shard of `values` (laid out like the pool) to every rank, the others' back (collective).")
      .def("save_state", [](const exchanger& x) { return py::bytes(x.port->save_state()); })
      .def("load_state", [](exchanger& x, const py::bytes& b) { x.port->load_state(std::string(b)); })
      .def("save_checkpoint", [](const exchanger& x, const std::string& root, const std::vector<py::buffer>& arrays) {
        std::vector<py::buffer_info> infos;
        std::vector<std::span<const float>> state;
        for (const py::buffer& b : arrays) {
          infos.push_back(b.request());
          const py::buffer_info& info = infos.back();
          if (info.format != py::format_descriptor<float>::format() || info.ndim != 1 || info.strides[0] != static_cast<py::ssize_t>(sizeof(float)))
            throw invalid_argument("state", "save_checkpoint takes contiguous one-dimensional float32 arrays (got format '" + info.format + "', " +
                                                std::to_string(info.ndim) + " dimensions).",
                                   "pass each state array packed over shard(), e.g. torch.cat([...]).numpy().");
          state.emplace_back(static_cast<const float*>(info.ptr), static_cast<std::size_t>(info.size));
        }
        return x.port->save_checkpoint(root, state);
      }, py::arg("root"), py::arg("state") = std::vector<py::buffer>{},
         "gflow::save_checkpoint: root/iter-<n>/rank-<r>.gflow (+ shard-<r>.gflow with state); the rank file's path.")
      .def("load_checkpoint", [](exchanger& x, const std::string& root, bool with_state) {
        auto [it, state] = x.port->load_checkpoint(root, with_state);
        py::list arrays;
        for (auto& a : state) {
          py::array_t<float> v(static_cast<py::ssize_t>(a.size()));
          std::copy(a.begin(), a.end(), v.mutable_data());
          arrays.append(v);
        }
        return py::make_tuple(it, arrays);
      }, py::arg("root"), py::arg("with_state") = false,
         "gflow::load_checkpoint: the newest complete set under root (re-sharded on another number of ranks); (iteration, state arrays).")
      .def("buckets", [](const exchanger& x) { return x.port->buckets(); })
      .def("selected_chunks", [](const exchanger& x) { return x.port->selected_chunks(); })
      .def("chunk_elems", [](const exchanger& x) { return x.port->chunk_elems(); })
      .def("configure", [](exchanger& x, double momentum, std::uint64_t warmup) { x.port->configure(momentum, warmup); })
      .def("set_timeline", [](exchanger& x, std::shared_ptr<timeline> tl) {
        x.port->set_timeline(tl.get());
        x.trace = std::move(tl);
      }, py::arg("timeline").none(true));
}
