// Python bindings of the shared-memory communicator: pointers travel as ints (tensor.data_ptr()),
// so the module needs only pybind11, not torch's headers, and every call releases the GIL
// (ShmCommunicator runs async collectives on a thread).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>

#include "shm_comm.h"

namespace py = pybind11;
using namespace tacit_shm;

namespace {

struct ShmContext {
  Ctx* c;
  ShmContext(const std::string& name, int rank, int world, int64_t slot_bytes, bool owner, double timeout_s,
             int64_t two_shot_min_bytes, int64_t chunk_bytes)
      : c(create(name, rank, world, slot_bytes, owner)) {
    c->timeout_s = timeout_s;
    c->two_shot_min_bytes = two_shot_min_bytes;
    if (chunk_bytes > 0) c->chunk_bytes = std::min<int64_t>(c->slot_bytes, (chunk_bytes + 63) / 64 * 64);
  }
  ~ShmContext() { close(); }
  void close() {
    if (c) destroy(c);
    c = nullptr;
  }
  Ctx* ctx() {
    if (!c) throw std::runtime_error("shm communicator: used after close()");
    return c;
  }
};

void* ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<ShmContext>(m, "ShmContext")
      .def(py::init<const std::string&, int, int, int64_t, bool, double, int64_t, int64_t>(), py::arg("name"),
           py::arg("rank"), py::arg("world"), py::arg("slot_bytes"), py::arg("owner"), py::arg("timeout_s"),
           py::arg("two_shot_min_bytes"), py::arg("chunk_bytes"))
      .def("unlink", [](ShmContext& s) { unlink_name(s.ctx()); })
      .def("close", &ShmContext::close)
      .def("all_reduce",
           [](ShmContext& s, uintptr_t data, int64_t numel, int dtype) {
             Ctx* c = s.ctx();
             py::gil_scoped_release nogil;
             all_reduce(c, ptr(data), numel, dtype);
           })
      .def("all_gather",
           [](ShmContext& s, uintptr_t in, uintptr_t out, int64_t nbytes) {
             Ctx* c = s.ctx();
             py::gil_scoped_release nogil;
             all_gather(c, ptr(in), ptr(out), nbytes);
           })
      .def("reduce_scatter",
           [](ShmContext& s, uintptr_t in, uintptr_t out, int64_t part_numel, int dtype) {
             Ctx* c = s.ctx();
             py::gil_scoped_release nogil;
             reduce_scatter(c, ptr(in), ptr(out), part_numel, dtype);
           })
      .def("all_to_all",
           [](ShmContext& s, uintptr_t in, uintptr_t out, std::vector<int64_t> send_bytes,
              std::vector<int64_t> recv_bytes) {
             Ctx* c = s.ctx();
             py::gil_scoped_release nogil;
             all_to_all(c, ptr(in), ptr(out), send_bytes, recv_bytes);
           })
      .def("send",
           [](ShmContext& s, uintptr_t data, int64_t nbytes, int dst) {
             Ctx* c = s.ctx();
             py::gil_scoped_release nogil;
             send(c, ptr(data), nbytes, dst);
           })
      .def("recv",
           [](ShmContext& s, uintptr_t data, int64_t nbytes, int src) {
             Ctx* c = s.ctx();
             py::gil_scoped_release nogil;
             recv(c, ptr(data), nbytes, src);
           })
      .def("ctx_ptr", [](ShmContext& s) { return reinterpret_cast<uintptr_t>(s.ctx()); })
      .def("last_error", [](ShmContext& s) { return s.ctx()->error; })
      .def_property_readonly("slot_bytes", [](ShmContext& s) { return s.ctx()->slot_bytes; })
      // Read-only: every rank must pick the same all-reduce algorithm for the same chunk.
      .def_property_readonly("two_shot_min_bytes", [](ShmContext& s) { return s.ctx()->two_shot_min_bytes; });
  m.def("all_reduce_fn_ptr", []() { return reinterpret_cast<uintptr_t>(&tacit_shm_all_reduce); });
}
