#include "tuner/bayes_opt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <string>

#include <LBFGSB.h>

#include "base/types.h"

namespace commsched::tuner {
namespace {

double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi); }
double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::numbers::sqrt2); }

double uniform01(std::mt19937_64& rng) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }

Eigen::VectorXd to_eigen(std::span<const double> x) {
  return Eigen::Map<const Eigen::VectorXd>(x.data(), static_cast<Eigen::Index>(x.size()));
}

std::vector<double> to_std(const Eigen::VectorXd& x) { return {x.data(), x.data() + x.size()}; }

}  // namespace

std::vector<std::vector<double>> latin_hypercube(int n, int dim, std::mt19937_64& rng) {
  std::vector<std::vector<double>> pts(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(dim)));
  std::vector<int> perm(static_cast<size_t>(n));
  for (int d = 0; d < dim; ++d) {
    std::iota(perm.begin(), perm.end(), 0);
    // Hand-written Fisher-Yates: std::shuffle's algorithm is unspecified, which would break seed determinism across
    // standard libraries.
    for (int i = n - 1; i > 0; --i) {
      const auto j = static_cast<int>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
    }
    for (int i = 0; i < n; ++i) {
      pts[static_cast<size_t>(i)][static_cast<size_t>(d)] = (perm[static_cast<size_t>(i)] + uniform01(rng)) / n;
    }
  }
  return pts;
}

BayesOpt::BayesOpt(const BayesOptOptions& options) : options_(options), rng_(options.seed), gp_(options.dim) {
  if (options_.dim < 1) throw InvalidArgument("BayesOpt: dim must be >= 1, got " + std::to_string(options_.dim));
  if (options_.initial_points <= 0) options_.initial_points = options_.dim + 3;
  if (options_.candidates < 1 || options_.local_starts < 0) {
    throw InvalidArgument("BayesOpt: candidates must be >= 1 and local_starts >= 0");
  }
  design_ = latin_hypercube(options_.initial_points, options_.dim, rng_);
}

bool BayesOpt::in_initial_design() const {
  return observations_.size() < static_cast<size_t>(options_.initial_points) && design_next_ < design_.size();
}

void BayesOpt::tell(std::span<const double> x, double y) {
  if (x.size() != static_cast<size_t>(options_.dim)) {
    throw InvalidArgument("BayesOpt::tell: point has " + std::to_string(x.size()) + " coordinates, expected " +
                          std::to_string(options_.dim));
  }
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] >= 0.0 && x[i] <= 1.0)) {
      throw InvalidArgument("BayesOpt::tell: coordinate " + std::to_string(i) + " = " + std::to_string(x[i]) +
                            " is outside [0,1]");
    }
  }
  if (!std::isfinite(y)) throw InvalidArgument("BayesOpt::tell: value for the point is not finite");
  observations_.push_back({std::vector<double>(x.begin(), x.end()), y});
  model_current_ = false;
}

std::optional<Observation> BayesOpt::best() const {
  if (observations_.empty()) return std::nullopt;
  const auto it = std::min_element(observations_.begin(), observations_.end(),
                                   [&](const Observation& a, const Observation& b) { return internal(a.y) < internal(b.y); });
  return *it;
}

std::optional<Observation> BayesOpt::best_by_model() {
  const auto i = best_index_by_model();
  if (!i) return std::nullopt;
  return observations_[*i];
}

std::optional<size_t> BayesOpt::best_index_by_model() {
  if (observations_.empty()) return std::nullopt;
  const auto by_value = [&](size_t a, size_t b) { return internal(observations_[a].y) < internal(observations_[b].y); };
  std::vector<size_t> idx(observations_.size());
  std::iota(idx.begin(), idx.end(), 0);
  if (observations_.size() < 3) return *std::min_element(idx.begin(), idx.end(), by_value);
  refit();
  size_t best_i = 0;
  double best_mean = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < observations_.size(); ++i) {
    const double m = gp_.predict_standardised(to_eigen(observations_[i].x)).mean;
    if (m < best_mean) {
      best_mean = m;
      best_i = i;
    }
  }
  return best_i;
}

void BayesOpt::refit() {
  if (model_current_) return;
  const auto n = static_cast<Eigen::Index>(observations_.size());
  Eigen::MatrixXd x(n, options_.dim);
  Eigen::VectorXd y(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    x.row(i) = to_eigen(observations_[static_cast<size_t>(i)].x).transpose();
    y(i) = internal(observations_[static_cast<size_t>(i)].y);
  }
  gp_.set_data(x, y);
  GpFitOptions fit = options_.fit;
  fit.seed = options_.fit.seed + options_.seed * 7919 + fits_++;  // fresh restarts each time, still reproducible
  gp_.fit(fit);
  model_current_ = true;
}

double BayesOpt::best_posterior_mean() const {
  double best = std::numeric_limits<double>::infinity();
  for (const auto& o : observations_) best = std::min(best, gp_.predict_standardised(to_eigen(o.x)).mean);
  return best;
}

// EI for minimisation in standardised units: (b - mu - xi) Phi(z) + sigma phi(z), z = (b - mu - xi) / sigma.
// Gradient: dEI = -Phi(z) dmu + phi(z) dsigma, with dsigma = dvar / (2 sigma).
BayesOpt::Ei BayesOpt::ei_standardised(const Eigen::VectorXd& x, double best_mean, bool want_grad) const {
  const GpPredictionGrad p = gp_.predict_standardised(x);
  const double sigma = std::sqrt(p.variance);
  const double gain = best_mean - p.mean - options_.xi;
  Ei out;
  if (want_grad) out.grad = Eigen::VectorXd::Zero(options_.dim);
  if (sigma < 1e-12) {
    out.value = std::max(gain, 0.0);
    if (want_grad && gain > 0) out.grad = -p.d_mean;
    return out;
  }
  const double z = gain / sigma;
  out.value = std::max(gain * normal_cdf(z) + sigma * normal_pdf(z), 0.0);
  if (want_grad) out.grad = -normal_cdf(z) * p.d_mean + normal_pdf(z) * p.d_variance / (2.0 * sigma);
  return out;
}

double BayesOpt::expected_improvement(std::span<const double> x) {
  if (observations_.empty()) return 0.0;
  refit();
  return ei_standardised(to_eigen(x), best_posterior_mean(), false).value * gp_.output_scale();
}

bool BayesOpt::too_close(const Eigen::VectorXd& x) const {
  for (const auto& o : observations_) {
    if ((to_eigen(o.x) - x).norm() < options_.min_distance) return true;
  }
  return false;
}

std::vector<Eigen::VectorXd> BayesOpt::candidate_points() {
  std::vector<Eigen::VectorXd> pts;
  pts.reserve(static_cast<size_t>(options_.candidates) + 64);
  for (int i = 0; i < options_.candidates; ++i) {
    Eigen::VectorXd x(options_.dim);
    for (int d = 0; d < options_.dim; ++d) x(d) = uniform01(rng_);
    pts.push_back(std::move(x));
  }
  // Perturbations of the best observations: the EI optimum is usually near them, and a uniform sample in a few
  // dimensions covers that neighbourhood only thinly.
  std::vector<size_t> order(observations_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return internal(observations_[a].y) < internal(observations_[b].y); });
  std::normal_distribution<double> step(0.0, 0.05);
  for (size_t k = 0; k < std::min<size_t>(3, order.size()); ++k) {
    for (int i = 0; i < 20; ++i) {
      Eigen::VectorXd x = to_eigen(observations_[order[k]].x);
      for (int d = 0; d < options_.dim; ++d) x(d) = std::clamp(x(d) + step(rng_), 0.0, 1.0);
      pts.push_back(std::move(x));
    }
  }
  return pts;
}

Eigen::VectorXd BayesOpt::refine(const Eigen::VectorXd& start, double best_mean, double scale) const {
  // Minimise -EI / scale: scaling by the best candidate's EI keeps the gradient tolerance meaningful when EI is tiny.
  struct Objective {
    const BayesOpt* self;
    double best_mean, scale;
    Eigen::VectorXd best_x;
    double best_value = std::numeric_limits<double>::infinity();
    double operator()(const Eigen::VectorXd& x, Eigen::VectorXd& grad) {
      const Ei e = self->ei_standardised(x, best_mean, true);
      grad = -e.grad / scale;
      const double v = -e.value / scale;
      if (v < best_value && !self->too_close(x)) {
        best_value = v;
        best_x = x;
      }
      return v;
    }
  } objective{this, best_mean, scale, start, std::numeric_limits<double>::infinity()};
  LBFGSpp::LBFGSBParam<double> param;
  param.max_iterations = 50;
  param.epsilon = 1e-8;
  param.epsilon_rel = 0.0;
  LBFGSpp::LBFGSBSolver<double> solver(param);
  const Eigen::VectorXd lo = Eigen::VectorXd::Zero(options_.dim), hi = Eigen::VectorXd::Ones(options_.dim);
  Eigen::VectorXd x = start;
  double fx = 0.0;
  try {
    solver.minimize(objective, x, fx, lo, hi);
  } catch (const std::exception&) {
    // The line search gave up (flat EI); the best point evaluated so far stands.
  }
  return objective.best_x;
}

std::vector<double> BayesOpt::farthest_random_point() {
  Eigen::VectorXd best_x;
  double best_d = -1.0;
  for (int i = 0; i < 256; ++i) {
    Eigen::VectorXd x(options_.dim);
    for (int d = 0; d < options_.dim; ++d) x(d) = uniform01(rng_);
    double dmin = std::numeric_limits<double>::infinity();
    for (const auto& o : observations_) dmin = std::min(dmin, (to_eigen(o.x) - x).norm());
    if (dmin > best_d) {
      best_d = dmin;
      best_x = x;
    }
  }
  return to_std(best_x);
}

std::vector<double> BayesOpt::ask() {
  while (in_initial_design()) {
    const std::vector<double>& p = design_[design_next_++];
    if (!too_close(to_eigen(p))) return p;
  }
  if (observations_.empty()) return farthest_random_point();
  refit();
  const double best_mean = best_posterior_mean();
  std::vector<Eigen::VectorXd> cands = candidate_points();
  std::vector<std::pair<double, size_t>> scored;
  scored.reserve(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    if (!too_close(cands[i])) scored.emplace_back(ei_standardised(cands[i], best_mean, false).value, i);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (scored.empty() || !(scored.front().first > 0.0)) {
    last_max_ei_ = 0.0;
    return farthest_random_point();
  }
  Eigen::VectorXd best_x = cands[scored.front().second];
  double best_ei = scored.front().first;
  const double scale = best_ei;
  for (size_t k = 0; k < std::min<size_t>(static_cast<size_t>(options_.local_starts), scored.size()); ++k) {
    const Eigen::VectorXd x = refine(cands[scored[k].second], best_mean, scale);
    const double e = ei_standardised(x, best_mean, false).value;
    if (e > best_ei && !too_close(x)) {
      best_ei = e;
      best_x = x;
    }
  }
  last_max_ei_ = best_ei * gp_.output_scale();
  return to_std(best_x.cwiseMax(0.0).cwiseMin(1.0));
}

bool BayesOpt::should_stop(size_t budget, double relative_ei) const {
  if (observations_.size() >= budget) return true;
  if (!last_max_ei_ || observations_.empty() || relative_ei <= 0.0) return false;
  const double reference = std::max(std::abs(best()->y), 1e-300);
  return *last_max_ei_ < relative_ei * reference;
}

}  // namespace commsched::tuner
