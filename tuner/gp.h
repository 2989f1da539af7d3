// Gaussian-process regression for the tuner: a Matérn 5/2 kernel with one length scale per input dimension (ARD),
// signal variance and observation noise, all fitted by maximising the log marginal likelihood.
//
// Inputs live in the unit cube [0,1]^d (the search space normalises them). Outputs are standardised internally
// (zero mean, unit variance) so that the hyperparameter bounds mean the same thing for every objective; predictions
// are returned in the caller's units. All solves go through a Cholesky factor; no explicit inverse is formed.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <Eigen/Cholesky>
#include <Eigen/Core>

namespace commsched::tuner {

// Hyperparameters in natural units (of the standardised outputs).
struct GpHyper {
  Eigen::VectorXd length_scales;  // one per input dimension
  double signal_variance = 1.0;
  double noise_variance = 1e-2;
};

// Box bounds for the fit, in natural units. Defaults suit inputs in [0,1] and standardised outputs.
struct GpBounds {
  double min_length = 0.01, max_length = 10.0;
  double min_signal = 0.05, max_signal = 20.0;
  double min_noise = 1e-6, max_noise = 1.0;
};

struct GpFitOptions {
  int restarts = 4;          // random starts besides the default and the previous optimum
  int max_iterations = 100;  // per L-BFGS-B run
  uint64_t seed = 1;
  GpBounds bounds;
};

// A prediction in the caller's units. variance is of the latent function (observation noise excluded).
struct GpPrediction {
  double mean = 0.0;
  double variance = 0.0;
};

// A prediction with its gradient with respect to the input, in standardised output units (what expected improvement
// needs for local refinement).
struct GpPredictionGrad {
  double mean = 0.0;
  double variance = 0.0;
  Eigen::VectorXd d_mean;
  Eigen::VectorXd d_variance;
};

class GaussianProcess {
 public:
  explicit GaussianProcess(int dim);

  int dim() const { return dim_; }
  size_t size() const { return static_cast<size_t>(y_.size()); }

  // Replaces the training data. x: one row per point, each coordinate in [0,1]. Throws InvalidArgument naming the
  // offending row/coordinate. Conditions on the current hyperparameters (call fit() to re-estimate them).
  void set_data(const Eigen::MatrixXd& x, const Eigen::VectorXd& y);

  // Maximises the log marginal likelihood over log-hyperparameters with L-BFGS-B from several starts (the default,
  // the current value, and `restarts` random points), then conditions on the best. Returns the best log likelihood.
  double fit(const GpFitOptions& options = {});

  // Sets hyperparameters explicitly (natural units); throws when a value is not positive or has the wrong size.
  void set_hyper(const GpHyper& h);
  const GpHyper& hyper() const { return hyper_; }

  // Log marginal likelihood of the standardised data under the given (or current) hyperparameters.
  double log_marginal_likelihood() const { return lml_; }
  double log_marginal_likelihood(const GpHyper& h) const;

  GpPrediction predict(const Eigen::VectorXd& x) const;
  // Standardised units; gradient with respect to x.
  GpPredictionGrad predict_standardised(const Eigen::VectorXd& x) const;

  // Converts between the caller's units and the standardised ones.
  double standardise(double y) const { return (y - y_mean_) / y_scale_; }
  double destandardise(double z) const { return z * y_scale_ + y_mean_; }
  double output_scale() const { return y_scale_; }

  // Log-hyperparameter vector [log l_1..log l_d, log signal, log noise] and its negative log likelihood + gradient;
  // exposed for the fit and for tests of the analytic gradient.
  Eigen::VectorXd pack(const GpHyper& h) const;
  GpHyper unpack(const Eigen::VectorXd& theta) const;
  double negative_lml(const Eigen::VectorXd& theta, Eigen::VectorXd* grad) const;

 private:
  Eigen::MatrixXd noise_free_kernel(const GpHyper& h) const;
  double kernel(const Eigen::VectorXd& a, const Eigen::VectorXd& b, const GpHyper& h) const;
  // Factorises K + noise*I, adding jitter when needed; nullopt when even the largest jitter fails.
  std::optional<Eigen::LLT<Eigen::MatrixXd>> factorise(const Eigen::MatrixXd& k_noisy) const;
  void condition();

  int dim_;
  Eigen::MatrixXd x_;
  Eigen::VectorXd y_;  // standardised
  double y_mean_ = 0.0, y_scale_ = 1.0;
  GpHyper hyper_;
  // Empty until the first factorisation: a default-constructed LLT has an uninitialised status that a move of the
  // whole GaussianProcess would read (UBSan reports it).
  std::optional<Eigen::LLT<Eigen::MatrixXd>> llt_;
  Eigen::VectorXd alpha_;  // (K + noise I)^{-1} y, by Cholesky solve
  double lml_ = 0.0;
};

}  // namespace commsched::tuner
