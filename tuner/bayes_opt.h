// Bayesian optimisation over the unit cube [0,1]^d with an ask/tell interface.
//
// ask() returns the next point to evaluate: first a Latin-hypercube initial design, then the maximiser of expected
// improvement under a Gaussian process (Matérn 5/2, hyperparameters refitted after every tell()). EI is maximised over
// a dense random sample (plus perturbations of the best observations), refined with L-BFGS-B from the best few
// candidates. The goal (minimise or maximise) is an option; internally everything is a minimisation.
// Deterministic for a given seed and sequence of tells. One ask() is meant to be followed by one tell() of that point,
// but tell() accepts any point (e.g. a configuration measured before tuning started).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "tuner/gp.h"

namespace commsched::tuner {

enum class Goal { minimize, maximize };

struct BayesOptOptions {
  int dim = 2;
  Goal goal = Goal::minimize;
  uint64_t seed = 1;
  int initial_points = 0;       // Latin-hypercube design size; 0 picks dim + 3
  int candidates = 2000;        // dense random sample for EI
  int local_starts = 4;         // L-BFGS-B refinements from the best candidates
  double xi = 0.01;             // EI exploration margin, in standardised output units
  double min_distance = 1e-3;   // never propose a point this close (Euclidean) to an observed one
  GpFitOptions fit;
};

struct Observation {
  std::vector<double> x;
  double y = 0.0;
};

class BayesOpt {
 public:
  explicit BayesOpt(const BayesOptOptions& options);

  std::vector<double> ask();
  // Records an evaluation; x must have dim coordinates in [0,1] and y must be finite (throws InvalidArgument).
  void tell(std::span<const double> x, double y);

  size_t num_observations() const { return observations_.size(); }
  const std::vector<Observation>& observations() const { return observations_; }
  // Best observed value (raw). nullopt before the first tell().
  std::optional<Observation> best() const;
  // The observed point whose posterior mean is best: robust to measurement noise, so it is what an online tuner
  // should keep. Falls back to best() while there are too few points for a model.
  std::optional<Observation> best_by_model();
  // Index into observations() of best_by_model(); nullopt before the first tell().
  std::optional<size_t> best_index_by_model();

  // Expected improvement at x in the caller's units (always >= 0), under the current model.
  double expected_improvement(std::span<const double> x);
  // Max EI found by the last model-based ask() in the caller's units; nullopt while still in the initial design.
  std::optional<double> last_max_expected_improvement() const { return last_max_ei_; }
  // True when `budget` observations are reached, or when the last ask's max EI is below relative_ei * |best|.
  bool should_stop(size_t budget, double relative_ei) const;
  bool in_initial_design() const;

  const GaussianProcess& model() const { return gp_; }
  const BayesOptOptions& options() const { return options_; }

 private:
  struct Ei {
    double value = 0.0;
    Eigen::VectorXd grad;
  };
  void refit();
  Ei ei_standardised(const Eigen::VectorXd& x, double best_mean, bool want_grad) const;
  double best_posterior_mean() const;  // standardised, over observed points
  std::vector<Eigen::VectorXd> candidate_points();
  Eigen::VectorXd refine(const Eigen::VectorXd& start, double best_mean, double scale) const;
  bool too_close(const Eigen::VectorXd& x) const;
  std::vector<double> farthest_random_point();
  double internal(double y) const { return options_.goal == Goal::maximize ? -y : y; }

  BayesOptOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::vector<double>> design_;
  size_t design_next_ = 0;
  std::vector<Observation> observations_;
  GaussianProcess gp_;
  bool model_current_ = false;
  uint64_t fits_ = 0;
  std::optional<double> last_max_ei_;
};

// Latin-hypercube sample of n points in [0,1]^dim (one point per stratum and dimension), deterministic for the rng.
std::vector<std::vector<double>> latin_hypercube(int n, int dim, std::mt19937_64& rng);

}  // namespace commsched::tuner
