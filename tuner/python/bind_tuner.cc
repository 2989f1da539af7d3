#include "tuner/python/bind_tuner.h"

#include <string>
#include <tuple>

#include <pybind11/stl.h>

#include "options/knobs.h"
#include "base/types.h"
#include "tuner/bayes_opt.h"
#include "tuner/search_space.h"

namespace py = pybind11;
using commsched::Knobs;
using commsched::KnobSpec;
using commsched::kKnobs;
using commsched::tuner::BayesOpt;
using commsched::tuner::BayesOptOptions;
using commsched::tuner::Goal;
using commsched::tuner::Observation;
using commsched::tuner::SearchSpace;
using commsched::tuner::SearchSpaceBounds;

namespace {

Goal parse_goal(const std::string& goal) {
  if (goal == "minimize" || goal == "min") return Goal::minimize;
  if (goal == "maximize" || goal == "max") return Goal::maximize;
  throw commsched::InvalidArgument("BayesOpt: goal='" + goal + "' (allowed: 'minimize', 'maximize')");
}

py::object observation_or_none(const std::optional<Observation>& o) {
  if (!o) return py::none();
  return py::make_tuple(o->x, o->y);
}

void bind_bayes_opt(py::module_& m) {
  py::class_<BayesOpt>(m, "BayesOpt", "Bayesian optimisation over [0,1]^dim (GP, Matern 5/2, expected improvement).")
      .def(py::init([](int dim, const std::string& goal, uint64_t seed, int initial_points, int candidates,
                       int local_starts, double xi) {
             BayesOptOptions o;
             o.dim = dim;
             o.goal = parse_goal(goal);
             o.seed = seed;
             o.initial_points = initial_points;
             o.candidates = candidates;
             o.local_starts = local_starts;
             o.xi = xi;
             return BayesOpt(o);
           }),
           py::arg("dim"), py::arg("goal") = "minimize", py::arg("seed") = 1, py::arg("initial_points") = 0,
           py::arg("candidates") = 2000, py::arg("local_starts") = 4, py::arg("xi") = 0.01)
      .def("ask", &BayesOpt::ask, "Next point to evaluate (list of floats in [0,1]).")
      .def("tell", [](BayesOpt& b, const std::vector<double>& x, double y) { b.tell(x, y); }, py::arg("x"),
           py::arg("y"))
      .def("best", [](const BayesOpt& b) { return observation_or_none(b.best()); },
           "(x, y) of the best observed value, or None.")
      .def("best_by_model", [](BayesOpt& b) { return observation_or_none(b.best_by_model()); },
           "(x, y) of the observed point with the best posterior mean, or None.")
      .def("expected_improvement", [](BayesOpt& b, const std::vector<double>& x) { return b.expected_improvement(x); })
      .def_property_readonly("last_max_expected_improvement", &BayesOpt::last_max_expected_improvement)
      .def("should_stop", &BayesOpt::should_stop, py::arg("budget"), py::arg("relative_ei"))
      .def_property_readonly("num_observations", &BayesOpt::num_observations)
      .def_property_readonly("in_initial_design", &BayesOpt::in_initial_design)
      .def_property_readonly("observations", [](const BayesOpt& b) {
        py::list out;
        for (const auto& o : b.observations()) out.append(py::make_tuple(o.x, o.y));
        return out;
      });
}

void bind_search_space(py::module_& m) {
  py::class_<SearchSpace>(m, "SearchSpace",
                          "The knob set (partition size, credit, small-tensor fusion bound) on log scales in [0,1]^dim; "
                          "credit 0 means unlimited, fusion bound 0 off.")
      // The keywords are the search space's options (SearchSpaceBounds, generated from the knob rows: min_partition,
      // max_partition, max_credit_multiple, unlimited_credit, min_small_tensor, ...); sizes as ints or with units.
      .def(py::init([](const py::kwargs& bounds) {
             SearchSpaceBounds b;
             for (const auto& [key, value] : bounds) {
               const std::string name = key.cast<std::string>();
               if (value.is_none()) continue;
               const std::string text = py::isinstance<py::bool_>(value) ? (value.cast<bool>() ? "1" : "0")
                                                                         : py::str(value).cast<std::string>();
               if (!b.set(name, text))
                 throw commsched::InvalidArgument("SearchSpace: unknown bound '" + name + "'");
             }
             return SearchSpace(b);
           }))
      .def_property_readonly_static("dim", [](const py::object&) { return SearchSpace().dim(); })
      .def("to_knobs",
           [](const SearchSpace& s, const std::vector<double>& u) {
             const Knobs k = s.to_knobs(u);
             py::list out;  // every knob of the knob set, in registry order
             for (const KnobSpec& spec : kKnobs) out.append(k.*spec.field);
             return py::tuple(out);
           },
           py::arg("u"),
           "(partition_bytes, credit_bytes, small_tensor_bytes) for a point; credit 0 means unlimited, fusion 0 off.")
      .def("from_knobs",
           [](const SearchSpace& s, const py::args& values, const py::kwargs& by_name) {
             // Knobs positionally in registry order or by name; a knob not given keeps its default.
             if (values.size() > commsched::kKnobCount) throw commsched::InvalidArgument("from_knobs: more values than knobs");
             Knobs k;
             for (size_t i = 0; i < values.size(); ++i) k.*kKnobs[i].field = values[i].cast<uint64_t>();
             for (const auto& [key, value] : by_name)
               k.*commsched::registered_knob(key.cast<std::string>()).field = value.cast<uint64_t>();
             const auto p = s.from_knobs(k);
             return std::vector<double>(p.begin(), p.end());
           },
           "the point of knobs given in registry order (partition_bytes, credit_bytes, small_tensor_bytes) or by name")
      .def("snap", [](const SearchSpace& s, const std::vector<double>& u) {
        const auto p = s.snap(u);
        return std::vector<double>(p.begin(), p.end());
      });
}

}  // namespace

void commsched_bind_tuner(py::module_& m) {
  // InvalidArgument derives from std::invalid_argument, which pybind11 already maps to ValueError.
  bind_bayes_opt(m);
  bind_search_space(m);
}
