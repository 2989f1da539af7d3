// commsched._C: the Python module over the C++ Context and Engine.
//
// Threading contract: the engine completes tasks on its scheduler thread, which never touches Python. A completion
// only fills a C++ Handle (a CompletionWaiter); Python polls it or waits on it with the GIL released.
// Tensors cross as raw addresses (CPU data pointer, or CUDA device pointer for NCCL): nothing is copied, and the Python
// side keeps the tensor alive until the handle has completed.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>

#include "base/stats.h"
#include "plugins/api/context.h"
#include "comm_backends/backend_registry.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/comm_backend.h"
#include "comm_backends/launcher_env.h"
#include "plugins/api/live_tuner.h"
#include "plugins/api/option_catalogue.h"
#include "plugins/python/bind_elastic.h"
#include "scheduler/completion_waiter.h"
#include "scheduler/policy_factory.h"
#include "scheduler/task.h"
#include "scheduler/timeline.h"
#include "tuner/python/bind_tuner.h"

namespace py = pybind11;
using namespace commsched;

namespace {

// Completion of one submitted task, shared between the engine's callback and Python.
class Handle {
 public:
  explicit Handle(Engine::Helper helper = {}) : helper_(std::move(helper)) { waiter_.expect(1); }
  void complete(const Status& s) { waiter_.settle(s); }
  bool poll() const { return waiter_.outstanding() == 0; }
  // Waits (GIL released by the binding) up to timeout_s seconds (negative: until it completes, in bounded slices, the
  // engine completing or failing every task); returns whether it completed.
  bool wait(double timeout_s) {
    const auto slice = timeout_s < 0 ? std::chrono::nanoseconds(std::chrono::hours(1))
                                     : std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::duration<double>(timeout_s));
    do wait_slice(slice);
    while (timeout_s < 0 && !poll());
    return poll();
  }
  // Empty when still running or successful; the error message otherwise.
  std::optional<std::string> error() const {
    const std::optional<Status> s = settled();
    if (!s || s->ok()) return std::nullopt;
    return s->message.empty() ? std::string("task failed") : s->message;
  }
  std::string code() const {
    const std::optional<Status> s = settled();
    if (!s) return "pending";
    switch (s->code) {
      case Status::Code::ok: return "ok";
      case Status::Code::error: return "error";
      case Status::Code::cancelled: return "cancelled";
      case Status::Code::peer_lost: return "peer_lost";
      case Status::Code::invalid: return "invalid";
    }
    return "error";
  }

 private:
  // The waiting thread does the backend's work meanwhile (it receives the collective's order and runs it: no
  // hand-off to the negotiator thread and back), while the backend lives.
  void wait_slice(std::chrono::nanoseconds slice) {
    if (const std::shared_ptr<CommBackend> alive = helper_.owner.lock()) waiter_.wait(slice, 0, helper_.helper);
    else waiter_.wait(slice);
  }

  // The task's status once it has completed.
  std::optional<Status> settled() const {
    if (!poll()) return std::nullopt;
    const std::vector<Status> failed = waiter_.failures();
    return failed.empty() ? Status::Ok() : failed.front();
  }

  Engine::Helper helper_;
  CompletionWaiter waiter_;
};

Device parse_device(const std::string& d) {
  if (d == "cpu") return Device::cpu;
  if (d == "cuda") return Device::cuda;
  throw InvalidArgument("device '" + d + "': expected 'cpu' or 'cuda'");
}

std::shared_ptr<Handle> submit(Context& ctx, std::string name, int32_t priority, const std::string& op,
                               const std::string& dtype, uintptr_t data, uint64_t count, const std::string& device,
                               int device_index, int root, const std::optional<std::string>& compression,
                               uintptr_t ready_event) {
  Engine& engine = ctx.engine();
  auto handle = std::make_shared<Handle>(engine.wait_helper());
  Task t;
  t.name = std::move(name);
  t.priority = priority;
  t.op = op == "reduce" ? ctx.reduce_op() : parse_op(op);
  t.dtype = parse_dtype(dtype);
  t.count = count;
  t.buffer = Buffer{reinterpret_cast<void*>(data), parse_device(device), device_index, reinterpret_cast<void*>(ready_event)};
  t.root = root;
  if (compression) t.compression = compression::parse_spec("compression", *compression);
  t.on_done = [handle](const Status& s) { handle->complete(s); };  // scheduler thread: C++ only
  py::gil_scoped_release release;  // submit may take the engine's locks; never hold the GIL there
  engine.submit(std::move(t));
  return handle;
}

// The C entry point other native plugins (the TensorFlow op library) submit through, so they link nothing of
// commsched's and share this module's engine: Python hands them its address and a Context's. Returns 0, or -1 with
// the reason in err. `done(arg, ok, message)` runs on the engine's scheduler thread: it must only hand off.
extern "C" {
using commsched_done_fn = void (*)(void* arg, int ok, const char* message);
}

int c_submit(void* context, const char* name, int32_t priority, const char* op, const char* dtype, void* data,
             uint64_t count, int32_t root, const char* compression, int flush, commsched_done_fn done, void* arg,
             char* err, size_t err_len) {
  try {
    Context& ctx = *static_cast<Context*>(context);
    Task t;
    t.name = name;
    t.priority = priority;
    t.op = std::string(op) == "reduce" ? ctx.reduce_op() : parse_op(op);
    t.dtype = parse_dtype(dtype);
    t.count = count;
    t.buffer = Buffer{data, Device::cpu, 0, nullptr};
    t.root = root;
    if (compression != nullptr && *compression != '\0') t.compression = compression::parse_spec("compression", compression);
    t.on_done = [done, arg](const Status& st) { done(arg, st.ok() ? 1 : 0, st.message.c_str()); };
    ctx.engine().submit(std::move(t));
    if (flush) ctx.engine().flush();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "%s", e.what());
    return -1;
  }
}

// A sub-cluster for a process set: this environment's cluster with the fields in `d` replaced (rank, num_workers,
// root_addr, root_port, local_rank, local_size, store_scope); never any servers. With a store_scope the members meet
// in the job's store at root_addr:root_port, where place_on_hosts (after this) finds local_rank and local_size.
ClusterEnv cluster_from_dict(const std::map<std::string, py::object>& d) {
  ClusterEnv e = ClusterEnv::from_env();
  e.num_servers = 0;
  for (const auto& [k, v] : d) {
    if (k == "rank") e.rank = v.cast<int>();
    else if (k == "num_workers") e.num_workers = v.cast<int>();
    else if (k == "root_addr") e.root_addr = v.cast<std::string>();
    else if (k == "root_port") e.root_port = v.cast<int>();
    else if (k == "local_rank") e.local_rank = v.cast<int>();
    else if (k == "local_size") e.local_size = v.cast<int>();
    else if (k == "store_scope") e.store_scope = v.cast<std::string>();
    else throw InvalidArgument("cluster field '" + k + "' is unknown (rank, num_workers, root_addr, root_port, "
                               "local_rank, local_size, store_scope)");
  }
  if (!e.store_scope.empty() && (d.count("local_rank") || d.count("local_size")))
    throw InvalidArgument("cluster: local_rank and local_size come from the store when store_scope is set");
  if (!e.store_scope.empty()) e.local_rank = 0, e.local_size = 1;  // until place_on_hosts reads them
  e.validate();
  return e;
}

// Horovod's API starts a trace at any time: where the environment asks for none (or says HOROVOD_TIMELINE=DYNAMIC),
// the engine records nothing until start_timeline(). On the configuration the Context is built from: one parse.
EngineConfig deferred_timeline(EngineConfig c) {
  if (c.timeline_path.empty() || c.timeline_path == "DYNAMIC") c.timeline_path = Timeline::kDeferred;
  return c;
}

py::list strings(const std::vector<std::string_view>& v) {
  py::list out;
  for (std::string_view s : v) out.append(std::string(s));
  return out;
}

py::dict option_dict(const OptionInfo& i) {
  py::dict d;
  d["name"] = i.name;
  d["aliases"] = i.aliases;
  d["env"] = i.env;
  d["group"] = i.group;
  d["type"] = i.type;
  d["default"] = i.default_value;
  d["allowed"] = i.allowed;
  d["doc"] = i.doc;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "commsched C++ engine (Context, Engine, task handles)";
  // C++ exceptions keep their messages: InvalidArgument -> ValueError, runtime_error -> RuntimeError.
  py::register_exception<InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);

  py::class_<Handle, std::shared_ptr<Handle>>(m, "Handle")
      .def("poll", &Handle::poll, "True once the task has completed (successfully or not)")
      .def("wait", &Handle::wait, py::arg("timeout_s") = -1.0, py::call_guard<py::gil_scoped_release>(),
           "wait (GIL released) up to timeout_s seconds (negative: forever); returns whether it completed")
      .def_property_readonly("error", &Handle::error)
      .def_property_readonly("code", &Handle::code);

  py::class_<StepStats>(m, "StepStats")
      .def_readonly("steps", &StepStats::steps)
      .def_readonly("last_step_s", &StepStats::last_step_s)
      .def_readonly("total_step_s", &StepStats::total_step_s);

  py::class_<Context>(m, "Context")
      .def(py::init([](std::map<std::string, std::string> engine, std::string backend, std::optional<bool> tune,
                       std::optional<std::map<std::string, py::object>> cluster, bool defer_timeline) {
             ContextOptions o{std::move(engine), std::move(backend), tune, std::nullopt, {}, {}};
             if (defer_timeline && !o.engine.count("timeline"))
               o.engine_config = deferred_timeline(EngineConfig::from_env());
             if (cluster) o.cluster = cluster_from_dict(*cluster);
             py::gil_scoped_release release;  // the rendezvous blocks
             if (o.cluster && !o.cluster->store_scope.empty()) collective::place_on_hosts(*o.cluster);
             return std::make_unique<Context>(o);
           }),
           py::arg("engine") = std::map<std::string, std::string>{}, py::arg("backend") = std::string(),
           py::arg("tune") = std::nullopt, py::arg("cluster") = std::nullopt, py::arg("defer_timeline") = false,
           "connects the backend (blocks for the rendezvous); `cluster` overrides fields of the environment's cluster "
           "(a process set's sub-cluster); defer_timeline: with no trace file from the environment (or "
           "HOROVOD_TIMELINE=DYNAMIC) nor `engine`, record nothing until start_timeline()")
      .def_property_readonly("rank", &Context::rank)
      .def_property_readonly("size", &Context::size)
      .def_property_readonly("local_rank", &Context::local_rank)
      .def_property_readonly("local_size", &Context::local_size)
      .def_property_readonly("root_addr", [](const Context& c) { return c.cluster().root_addr; })
      .def_property_readonly("root_port", [](const Context& c) { return c.cluster().root_port; },
                             "where the job's one rendezvous store listens (with root_addr; a process set meets there)")
      .def_property_readonly("num_servers", [](const Context& c) { return c.cluster().num_servers; })
      .def_property_readonly("backend", [](const Context& c) { return std::string(backend_kind_name(c.backend_kind())); })
      .def_property_readonly("policy", [](Context& c) { return std::string(c.engine().policy_name()); })
      .def_property_readonly("reduce_op", [](const Context& c) { return std::string(op_name(c.reduce_op())); })
      .def_property_readonly("stages_device_copies", &Context::stages_device_copies,
                             "whether CUDA tensors travel through pinned host staging (a host-only backend)")
      .def_property_readonly("iteration", [](Context& c) { return c.engine().iteration(); })
      .def_property_readonly("step_stats", &Context::step_stats)
      .def_property_readonly("is_shut_down", &Context::is_shut_down)
      .def_property_readonly("address", [](Context& c) { return reinterpret_cast<uintptr_t>(&c); },
                             "this Context's address, for native plugins that submit through c_submit_address")
      .def("knobs", [](Context& c) {
             const Knobs k = c.engine().knobs();
             py::dict d;  // the knob set by name (0: no split / no limit / no fusion)
             for (const KnobSpec& spec : kKnobs) d[py::str(std::string(spec.name))] = k.*spec.field;
             return d;
           }, "the live knobs by name, e.g. {'partition_bytes': 4194304, 'credit_bytes': 16777216, 'small_tensor_bytes': 0}")
      .def("set_knobs", [](Context& c, const std::map<std::string, uint64_t>& values) {
             Knobs k = c.engine().knobs();
             for (const auto& [name, value] : values) {
               const KnobSpec* spec = nullptr;
               for (const KnobSpec& s : kKnobs)
                 if (s.name == name) spec = &s;
               if (spec == nullptr) {
                 std::vector<std::string> names;
                 for (const KnobSpec& s : kKnobs) names.emplace_back(s.name);
                 throw InvalidArgument("unknown knob '" + name + "' (knobs: " + join_names(names) + ")");
               }
               k.*spec->field = value;
             }
             c.engine().set_knobs(k);
           }, py::arg("knobs"), "changes the named knobs at the next iteration boundary; the others keep their values")
      .def("submit", &submit, py::arg("name"), py::arg("priority"), py::arg("op"), py::arg("dtype"), py::arg("data"),
           py::arg("count"), py::arg("device") = "cpu", py::arg("device_index") = 0, py::arg("root") = 0,
           py::arg("compression") = py::none(), py::arg("ready_event") = 0,
           "queues one task over `count` elements at address `data`; op is push_pull, allreduce, broadcast or "
           "'reduce' (the backend's own reduction); compression: 'fp16', 'bf16', 'topk:R', 'signsgd', 'none' or "
           "None (the engine's default); ready_event: a CUDA event (cudaEvent_t address) recorded after the producer wrote "
           "the tensor, which the device copy waits for (0: the data is ready); returns a Handle")
      .def("backward_done", [](Context& c) { c.engine().backward_done(); }, py::call_guard<py::gil_scoped_release>())
      .def("flush", [](Context& c) { c.engine().flush(); }, py::call_guard<py::gil_scoped_release>(),
           "releases tasks that are not part of a backward (BSP and MG-WFBP would otherwise hold them until "
           "backward_done); the iteration does not advance")
      .def("stragglers", [](Context& c) {
             py::list out;
             const StragglerReport* report = c.engine().backend().capabilities().stragglers;
             for (const Straggler& s : report ? report->stragglers() : std::vector<Straggler>{}) {
               py::dict d;
               d["rank"] = s.rank;
               d["iterations_behind"] = s.iterations;
               d["seconds_behind"] = s.seconds;
               out.append(d);
             }
             return out;
           },
           "the ranks that lag, most seconds behind first, as this rank last heard it (dicts: rank, "
           "iterations_behind, seconds_behind)")
      .def_property_readonly("joins", [](Context& c) { return c.engine().backend().capabilities().joins != nullptr; },
                             "whether the backend stands in with zeros for ranks that have joined (the PS does)")
      .def("join", [](Context& c) { return c.engine().join(); }, py::call_guard<py::gil_scoped_release>(),
           "Horovod's join: waits for this rank's tasks, then until every rank has joined, standing in with zeros "
           "for the reductions the others still run; returns the rank that joined last")
      .def("iteration_end", &Context::iteration_end, py::call_guard<py::gil_scoped_release>())
      .def("set_model", [](Context& c, std::vector<uint64_t> tensor_bytes) { c.set_model(tensor_bytes); },
           py::arg("tensor_bytes"), "the model's gradient sizes in bytes, in forward order (keys the tuner's store)")
      .def_property_readonly("tuning", &Context::tuning, "whether the online auto-tuner is on (COMMSCHED_TUNE)")
      .def_property_readonly("wants_backward_times", &Context::wants_backward_times,
                             "whether note_backward() is wanted (rank 0, tuning, before the tuner starts)")
      .def("note_backward", &Context::note_backward, py::arg("ready_s"),
           "when each gradient of set_model()'s tensors became ready in one backward (seconds; negative: not seen); "
           "the tuner's warm start simulates the model with that backward compute")
      .def("tuner_state", [](const Context& c) {
             py::dict d;
             const LiveTuner* t = c.tuner();
             d["enabled"] = c.tuning();
             d["started"] = t != nullptr;
             d["finished"] = t != nullptr && t->finished();
             d["trials"] = t ? t->tuner().trials_done() : 0;
             if (const std::optional<Knobs> best = t ? t->tuner().best_knobs() : std::nullopt)
               for (const KnobSpec& k : kKnobs)  // best_partition_bytes, best_credit_bytes, ...: the knob set
                 d[py::str("best_" + std::string(k.name))] = (*best).*k.field;
             return d;
           }, "the auto-tuner's progress: enabled, started, finished, trials, best knobs so far")
      .def("wait_all", [](Context& c, double timeout_s) {
             return c.engine().wait_all_for(std::chrono::nanoseconds(static_cast<int64_t>(timeout_s * 1e9)));
           }, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &Context::shutdown, py::call_guard<py::gil_scoped_release>());

  py::dict build;  // what this build carries (the Horovod-style *_built() queries answer from the backend registry)
  for (const BackendInfo& b : backend_registry()) build[py::str(std::string(b.name))] = b.available;
  build["cuda"] = find_backend("nccl") != nullptr && find_backend("nccl")->available;
  m.attr("build") = build;

  // BytePS's DMLC_ROLE=scheduler: init() prints it and exits 0 (commsched runs no scheduler); empty otherwise.
  m.def("scheduler_role_notice", &scheduler_role_notice);
  m.def(
      "mean_ci95",
      [](const std::vector<double>& values) {
        const MeanCi r = mean_ci95(values);
        return py::make_tuple(r.mean, r.half_width);
      },
      py::arg("values"),
      "(mean, half-width of its two-sided 95% interval, Student t); half-width 0 for fewer than two values");
  m.def(
      "check_compression",
      [](const std::string& what, const std::string& spec) { compression::parse_spec(what, spec); },
      py::arg("what"), py::arg("spec"),
      "raises ValueError (naming `what` and the allowed schemes) unless `spec` is one the engine takes");
  m.def("student_t95", &student_t95, py::arg("dof"), "two-sided 95% quantile of Student's t (dof >= 1)");
  m.def(
      "context_env",
      [] {
        const ContextEnvOptions o = ContextEnvOptions::from_env();
        py::dict d;
        d["backend"] = o.backend;
        d["tune"] = o.tune;
        d["link_probe"] = o.link_probe;
        d["cross_iteration"] = o.cross_iteration;
        return d;
      },
      "the context options (COMMSCHED_BACKEND, _TUNE, _LINK_PROBE, _CROSS_ITERATION) parsed from the environment by "
      "the registry; a bad value raises ValueError naming the variable and the allowed values");
  m.def("explain_env", &ClusterEnv::explain_env, "the launcher detected and the cluster contract derived from it");
  bind_elastic(m);

  // The registries, so Python keeps no list of its own: init() keywords are option names, the flush rule asks the
  // policy registry.
  m.def("options", [] {
        py::list out;
        for (const OptionInfo& i : all_options()) out.append(option_dict(i));
        return out;
      }, "every option of the registry: name, aliases, env, group, type, default, allowed, doc");
  m.def("policies", [] {
        py::list out;
        for (const PolicyInfo& p : policy_registry()) {
          py::dict d;
          d["name"] = std::string(p.name);
          d["aliases"] = strings(p.aliases);
          d["holds_tasks"] = p.holds_tasks;
          d["options"] = strings(p.options);
          d["description"] = std::string(p.description);
          out.append(d);
        }
        return out;
      }, "the policy registry: name, aliases, holds_tasks, options, description");
  m.def("backends", [] {
        py::list out;
        for (const BackendInfo& b : backend_registry()) {
          py::dict d;
          d["name"] = std::string(b.name);
          d["available"] = b.available;
          py::list ops, devices;
          for (Op op : b.ops) ops.append(std::string(op_name(op)));
          for (Device dev : b.devices) devices.append(dev == Device::cpu ? "cpu" : "cuda");
          d["ops"] = ops;
          d["devices"] = devices;
          d["description"] = std::string(b.description);
          out.append(d);
        }
        return out;
      }, "the backend registry for this build: name, available, ops, devices, description");
  m.def("knob_names", [] {
        py::list out;
        for (const KnobSpec& k : kKnobs) out.append(std::string(k.name));
        return out;
      }, "the knob set, in the order Context.knobs() returns it");

  // Horovod's start_timeline / stop_timeline act on the trace of every engine of this process (the plugin runs one;
  // process sets' engines have none). An engine built with timeline=TIMELINE_DEFERRED records nothing until started.
  m.attr("TIMELINE_DEFERRED") = Timeline::kDeferred;
  m.def("start_timeline", [](const std::string& path) { return Timeline::restart_all(path); }, py::arg("path"),
        "writes every engine's trace to `path` from now on (rank in the file name); returns how many engines");
  m.def("stop_timeline", [] { return Timeline::stop_all(); }, "finishes every engine's trace file");
  m.def("timeline_path", [](int rank, const std::string& path) { return Timeline::rank_path(path, rank); },
        py::arg("rank"), py::arg("path"), "the file a rank's trace goes to");

  m.def("c_submit_address", [] { return reinterpret_cast<uintptr_t>(&c_submit); },
        "the address of the C submit entry point native framework plugins call (see module.cc)");
  m.def("task_key", [](const std::string& name) { return task_key(name); },
        "the 64-bit wire key of a task name (the parameter server names tensors by it)");
  py::module_ tuner = m.def_submodule("tuner", "Bayesian tuner (ask/tell) and search space");
  commsched_bind_tuner(tuner);
}
