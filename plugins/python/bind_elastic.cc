// commsched._C's pieces for elastic training (python/commsched/_elastic.py) and process sets: the cluster contract as
// this process reads it, the rendezvous store (server and client) that holds an elastic job's membership, and the
// control plane's address rules (a free port for a store, the address that faces the root).
#include "plugins/python/bind_elastic.h"

#include <pybind11/stl.h>

#include <chrono>
#include <memory>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"

namespace py = pybind11;

namespace commsched {
namespace {

std::chrono::milliseconds to_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

py::dict cluster_env_dict() {
  const ClusterEnv e = ClusterEnv::from_env();
  py::dict d;
  d["role"] = e.role == Role::server ? "server" : "worker";
  d["rank"] = e.rank;
  d["num_workers"] = e.num_workers;
  d["num_servers"] = e.num_servers;
  d["local_rank"] = e.local_rank;
  d["local_size"] = e.local_size;
  d["root_addr"] = e.root_addr;
  d["root_port"] = e.root_port;
  d["timeout_s"] = e.timeout_s;
  d["generation"] = e.generation;
  d["min_workers"] = e.min_workers;
  d["max_workers"] = e.max_workers;
  d["elastic_store"] = e.elastic_store;
  return d;
}

// The secret of the run as every store of it uses it (the store binds `host`).
std::string store_secret(const std::string& host) { return ClusterAuth::from_env().secret_for(host); }

}  // namespace

void bind_elastic(py::module_& m) {
  m.def("cluster_env", &cluster_env_dict, "the cluster contract this process derives from its environment");
  m.def("advertised_host", [] { return control::advertised_host(ClusterEnv::from_env()); },
        "the address this process's peers reach it at: COMMSCHED_BIND's, else the one on the route to the root");
  m.def("free_port", &control::free_port, py::arg("host") = "127.0.0.1",
        "a TCP port on host nobody listens on, below the kernel's ephemeral range (for a rendezvous store to bind)");
  py::class_<collective::TcpStoreServer>(m, "StoreServer", "a rendezvous store served from a background thread")
      .def(py::init([](const std::string& host, int port) {
             return std::make_unique<collective::TcpStoreServer>(host, port, store_secret(host));
           }),
           py::arg("host"), py::arg("port"))
      .def_property_readonly("port", &collective::TcpStoreServer::port);
  using Client = collective::TcpStoreClient;
  py::class_<Client>(m, "StoreClient", "a client of the rendezvous store, authenticated with the run's secret")
      .def(py::init([](const std::string& host, int port, double timeout_s) {
             return std::make_unique<Client>(host, port, to_ms(timeout_s), store_secret(host));
           }),
           py::arg("host"), py::arg("port"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def("set", [](Client& c, const std::string& k, const py::bytes& v) {
             std::string value = v;
             py::gil_scoped_release release;
             c.set(k, value);
           })
      .def("get", [](Client& c, const std::string& k, double timeout_s) {
             std::string v;
             {
               py::gil_scoped_release release;
               v = c.get(k, to_ms(timeout_s));
             }
             return py::bytes(v);
           }, py::arg("key"), py::arg("timeout_s"), "the value; raises RuntimeError naming the key on timeout")
      .def("contains", &Client::contains, py::call_guard<py::gil_scoped_release>())
      .def("add", &Client::add, py::arg("key"), py::arg("delta"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace commsched
