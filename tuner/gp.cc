#include "tuner/gp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>

#include <LBFGSB.h>

#include "base/types.h"

namespace commsched::tuner {
namespace {

constexpr double kSqrt5 = 2.23606797749978969640;
// Returned by the objective when no jitter makes the kernel matrix positive definite: large enough that the line
// search backs off, finite so that L-BFGS-B's arithmetic stays defined.
constexpr double kInfeasible = 1e25;

// Matérn 5/2 correlation as a function of the scaled distance r, and the common factor of its derivatives:
// d k / d(r^2 component) = -(5/6) sf2 (1 + sqrt5 r) exp(-sqrt5 r); see negative_lml().
double matern52(double r) { return (1.0 + kSqrt5 * r + 5.0 / 3.0 * r * r) * std::exp(-kSqrt5 * r); }
double matern52_slope(double r) { return 5.0 / 3.0 * (1.0 + kSqrt5 * r) * std::exp(-kSqrt5 * r); }

double scaled_distance(const Eigen::VectorXd& a, const Eigen::VectorXd& b, const Eigen::VectorXd& ls) {
  return std::sqrt(((a - b).array() / ls.array()).square().sum());
}

GpHyper default_hyper(int dim) {
  GpHyper h;
  h.length_scales = Eigen::VectorXd::Constant(dim, 0.3);
  h.signal_variance = 1.0;
  h.noise_variance = 1e-2;
  return h;
}

}  // namespace

GaussianProcess::GaussianProcess(int dim) : dim_(dim), x_(0, dim), y_(0), hyper_(default_hyper(dim)) {
  if (dim < 1) throw InvalidArgument("GaussianProcess: dimension must be >= 1, got " + std::to_string(dim));
}

void GaussianProcess::set_data(const Eigen::MatrixXd& x, const Eigen::VectorXd& y) {
  if (x.cols() != dim_) {
    throw InvalidArgument("GaussianProcess::set_data: x has " + std::to_string(x.cols()) + " columns, expected " +
                          std::to_string(dim_));
  }
  if (x.rows() != y.size()) {
    throw InvalidArgument("GaussianProcess::set_data: " + std::to_string(x.rows()) + " inputs but " +
                          std::to_string(y.size()) + " outputs");
  }
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      if (!(x(i, j) >= 0.0 && x(i, j) <= 1.0)) {
        throw InvalidArgument("GaussianProcess::set_data: x(" + std::to_string(i) + "," + std::to_string(j) +
                              ") = " + std::to_string(x(i, j)) + " is outside [0,1]");
      }
    }
    if (!std::isfinite(y(i))) {
      throw InvalidArgument("GaussianProcess::set_data: y(" + std::to_string(i) + ") is not finite");
    }
  }
  x_ = x;
  const Eigen::Index n = y.size();
  y_mean_ = n > 0 ? y.mean() : 0.0;
  const double var = n > 1 ? (y.array() - y_mean_).square().sum() / static_cast<double>(n) : 0.0;
  // A constant objective has no scale of its own; 1 keeps the arithmetic defined and the predictions exact.
  y_scale_ = var > 1e-24 ? std::sqrt(var) : 1.0;
  y_ = (y.array() - y_mean_) / y_scale_;
  condition();
}

void GaussianProcess::set_hyper(const GpHyper& h) {
  if (h.length_scales.size() != dim_) {
    throw InvalidArgument("GaussianProcess::set_hyper: " + std::to_string(h.length_scales.size()) +
                          " length scales for dimension " + std::to_string(dim_));
  }
  if (!(h.length_scales.array() > 0).all() || !(h.signal_variance > 0) || !(h.noise_variance > 0)) {
    throw InvalidArgument("GaussianProcess::set_hyper: length scales, signal and noise variance must be positive");
  }
  hyper_ = h;
  condition();
}

double GaussianProcess::kernel(const Eigen::VectorXd& a, const Eigen::VectorXd& b, const GpHyper& h) const {
  return h.signal_variance * matern52(scaled_distance(a, b, h.length_scales));
}

Eigen::MatrixXd GaussianProcess::noise_free_kernel(const GpHyper& h) const {
  const Eigen::Index n = x_.rows();
  Eigen::MatrixXd k(n, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    k(i, i) = h.signal_variance;
    for (Eigen::Index j = 0; j < i; ++j) {
      k(i, j) = k(j, i) = kernel(x_.row(i).transpose(), x_.row(j).transpose(), h);
    }
  }
  return k;
}

std::optional<Eigen::LLT<Eigen::MatrixXd>> GaussianProcess::factorise(const Eigen::MatrixXd& k_noisy) const {
  Eigen::LLT<Eigen::MatrixXd> llt(k_noisy);
  if (llt.info() == Eigen::Success) return llt;
  // Near-duplicate inputs with tiny noise make K numerically singular; a growing diagonal jitter restores it.
  const double scale = k_noisy.diagonal().mean();
  for (double jitter = 1e-10; jitter <= 1e-3; jitter *= 10) {
    Eigen::MatrixXd k = k_noisy;
    k.diagonal().array() += jitter * scale;
    llt.compute(k);
    if (llt.info() == Eigen::Success) return llt;
  }
  return std::nullopt;
}

void GaussianProcess::condition() {
  const Eigen::Index n = y_.size();
  if (n == 0) {
    alpha_.resize(0);
    llt_.reset();
    lml_ = 0.0;
    return;
  }
  Eigen::MatrixXd k = noise_free_kernel(hyper_);
  k.diagonal().array() += hyper_.noise_variance;
  auto llt = factorise(k);
  if (!llt) throw std::runtime_error("GaussianProcess: kernel matrix is not positive definite even with jitter");
  llt_ = std::move(llt);
  alpha_ = llt_->solve(y_);
  const double log_det = 2.0 * llt_->matrixLLT().diagonal().array().log().sum();
  lml_ = -0.5 * y_.dot(alpha_) - 0.5 * log_det - 0.5 * static_cast<double>(n) * std::log(2.0 * std::numbers::pi);
}

Eigen::VectorXd GaussianProcess::pack(const GpHyper& h) const {
  Eigen::VectorXd theta(dim_ + 2);
  theta.head(dim_) = h.length_scales.array().log();
  theta(dim_) = std::log(h.signal_variance);
  theta(dim_ + 1) = std::log(h.noise_variance);
  return theta;
}

GpHyper GaussianProcess::unpack(const Eigen::VectorXd& theta) const {
  GpHyper h;
  h.length_scales = theta.head(dim_).array().exp();
  h.signal_variance = std::exp(theta(dim_));
  h.noise_variance = std::exp(theta(dim_ + 1));
  return h;
}

double GaussianProcess::log_marginal_likelihood(const GpHyper& h) const { return -negative_lml(pack(h), nullptr); }

// -log p(y | X, theta) = 0.5 y'a + sum log diag L + n/2 log 2pi, with a = K^{-1} y.
// d/dtheta_j = -0.5 tr((a a' - K^{-1}) dK/dtheta_j). For the Matérn 5/2 kernel, with d_i = (x_i - x'_i)/l_i:
//   dK/dlog l_i = (5/3) sf2 (1 + sqrt5 r) exp(-sqrt5 r) d_i^2,  dK/dlog sf2 = K_f,  dK/dlog sn2 = sn2 I.
double GaussianProcess::negative_lml(const Eigen::VectorXd& theta, Eigen::VectorXd* grad) const {
  const GpHyper h = unpack(theta);
  const Eigen::Index n = y_.size();
  if (grad) grad->setZero(theta.size());
  if (n == 0) return 0.0;
  const Eigen::MatrixXd k_f = noise_free_kernel(h);
  Eigen::MatrixXd k = k_f;
  k.diagonal().array() += h.noise_variance;
  const auto llt = factorise(k);
  if (!llt) return kInfeasible;
  const Eigen::VectorXd alpha = llt->solve(y_);
  const double log_det_half = llt->matrixLLT().diagonal().array().log().sum();
  const double nlml = 0.5 * y_.dot(alpha) + log_det_half + 0.5 * static_cast<double>(n) * std::log(2.0 * std::numbers::pi);
  if (!grad) return nlml;

  // The trace form needs K^{-1} itself; it comes from Cholesky solves against the identity, not from inverse().
  const Eigen::MatrixXd a = alpha * alpha.transpose() - llt->solve(Eigen::MatrixXd::Identity(n, n));
  Eigen::VectorXd acc = Eigen::VectorXd::Zero(dim_);
  for (Eigen::Index i = 0; i < n; ++i) {
    for (Eigen::Index j = 0; j < i; ++j) {
      const double r = scaled_distance(x_.row(i).transpose(), x_.row(j).transpose(), h.length_scales);
      const double s = 2.0 * a(i, j) * h.signal_variance * matern52_slope(r);  // symmetric pair counted twice
      acc.array() += s * ((x_.row(i) - x_.row(j)).transpose().array() / h.length_scales.array()).square();
    }
  }
  grad->head(dim_) = -0.5 * acc;
  (*grad)(dim_) = -0.5 * (a.array() * k_f.array()).sum();
  (*grad)(dim_ + 1) = -0.5 * h.noise_variance * a.trace();
  return nlml;
}

namespace {

// Wraps the objective for LBFGSpp and remembers the best point evaluated, so that a line search that gives up
// (LBFGSpp throws) still leaves a usable result.
struct NlmlObjective {
  const GaussianProcess* gp;
  Eigen::VectorXd best_theta;
  double best_value = std::numeric_limits<double>::infinity();

  double operator()(const Eigen::VectorXd& theta, Eigen::VectorXd& grad) {
    const double v = gp->negative_lml(theta, &grad);
    if (!std::isfinite(v) || !grad.allFinite()) {
      grad.setZero();
      return kInfeasible;
    }
    if (v < best_value) {
      best_value = v;
      best_theta = theta;
    }
    return v;
  }
};

}  // namespace

double GaussianProcess::fit(const GpFitOptions& options) {
  if (y_.size() == 0) return 0.0;
  const GpBounds& b = options.bounds;
  Eigen::VectorXd lo(dim_ + 2), hi(dim_ + 2);
  lo.head(dim_).setConstant(std::log(b.min_length));
  hi.head(dim_).setConstant(std::log(b.max_length));
  lo(dim_) = std::log(b.min_signal);
  hi(dim_) = std::log(b.max_signal);
  lo(dim_ + 1) = std::log(b.min_noise);
  hi(dim_ + 1) = std::log(b.max_noise);

  std::vector<Eigen::VectorXd> starts{pack(default_hyper(dim_)), pack(hyper_)};
  std::mt19937_64 rng(options.seed);
  for (int s = 0; s < options.restarts; ++s) {
    Eigen::VectorXd t(dim_ + 2);
    for (int i = 0; i < dim_ + 2; ++i) t(i) = std::uniform_real_distribution<double>(lo(i), hi(i))(rng);
    starts.push_back(t);
  }

  LBFGSpp::LBFGSBParam<double> param;
  param.max_iterations = options.max_iterations;
  param.epsilon = 1e-6;
  param.epsilon_rel = 1e-6;
  NlmlObjective objective{this, {}, std::numeric_limits<double>::infinity()};
  for (Eigen::VectorXd theta : starts) {
    theta = theta.cwiseMax(lo).cwiseMin(hi);
    LBFGSpp::LBFGSBSolver<double> solver(param);
    double fx = 0.0;
    try {
      solver.minimize(objective, theta, fx, lo, hi);
    } catch (const std::exception&) {
      // A failed line search ends this start early; the best point it evaluated is kept by the objective.
    }
  }
  if (objective.best_theta.size() == dim_ + 2) set_hyper(unpack(objective.best_theta));
  return lml_;
}

GpPrediction GaussianProcess::predict(const Eigen::VectorXd& x) const {
  const GpPredictionGrad p = predict_standardised(x);
  return {destandardise(p.mean), p.variance * y_scale_ * y_scale_};
}

GpPredictionGrad GaussianProcess::predict_standardised(const Eigen::VectorXd& x) const {
  if (x.size() != dim_) {
    throw InvalidArgument("GaussianProcess::predict: point has " + std::to_string(x.size()) + " coordinates, expected " +
                          std::to_string(dim_));
  }
  GpPredictionGrad out;
  out.d_mean = Eigen::VectorXd::Zero(dim_);
  out.d_variance = Eigen::VectorXd::Zero(dim_);
  const Eigen::Index n = y_.size();
  out.variance = hyper_.signal_variance;
  if (n == 0) return out;

  Eigen::VectorXd k_star(n);
  Eigen::MatrixXd dk(n, dim_);  // d k_star(j) / d x_i
  const Eigen::ArrayXd inv_l2 = hyper_.length_scales.array().square().inverse();
  for (Eigen::Index j = 0; j < n; ++j) {
    const Eigen::VectorXd xj = x_.row(j).transpose();
    const double r = scaled_distance(x, xj, hyper_.length_scales);
    k_star(j) = hyper_.signal_variance * matern52(r);
    // d k / d x_i = -(5/3) sf2 (1 + sqrt5 r) exp(-sqrt5 r) (x_i - xj_i) / l_i^2 (smooth at r = 0).
    dk.row(j) = (-hyper_.signal_variance * matern52_slope(r) * (x - xj).array() * inv_l2).matrix().transpose();
  }
  const Eigen::VectorXd w = llt_->solve(k_star);  // K^{-1} k*
  out.mean = k_star.dot(alpha_);
  out.variance = std::max(hyper_.signal_variance - k_star.dot(w), 0.0);
  out.d_mean = dk.transpose() * alpha_;
  out.d_variance = -2.0 * dk.transpose() * w;
  return out;
}

}  // namespace commsched::tuner
