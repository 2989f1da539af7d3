#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "base/types.h"
#include "tuner/gp.h"

namespace commsched::tuner {
namespace {

double f1(double x) { return std::sin(6.0 * x) + 0.5 * x; }
double f2(double a, double b) { return std::sin(3.0 * a) * std::cos(2.0 * b) + 0.3 * b; }

struct HeldOut {
  double rmse = 0.0;
  double within_two_sigma = 0.0;  // fraction of held-out points with |y - mean| <= 2 sd (noise included)
};

// Fits a GP to n random noisy samples of f in [0,1]^d and scores it on m held-out noisy points.
template <typename F>
HeldOut fit_and_score(int d, int n, int m, double noise_sd, F f, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> eps(0.0, noise_sd);
  auto sample = [&](int count, Eigen::MatrixXd& x, Eigen::VectorXd& y) {
    x.resize(count, d);
    y.resize(count);
    for (int i = 0; i < count; ++i) {
      for (int j = 0; j < d; ++j) x(i, j) = u(rng);
      y(i) = f(x.row(i).transpose()) + eps(rng);
    }
  };
  Eigen::MatrixXd x, xt;
  Eigen::VectorXd y, yt;
  sample(n, x, y);
  sample(m, xt, yt);
  GaussianProcess gp(d);
  gp.set_data(x, y);
  gp.fit();
  HeldOut h;
  int inside = 0;
  double se = 0.0;
  const double noise_var = gp.hyper().noise_variance * gp.output_scale() * gp.output_scale();
  for (int i = 0; i < m; ++i) {
    const GpPrediction p = gp.predict(xt.row(i).transpose());
    const double err = yt(i) - p.mean;
    se += err * err;
    if (std::abs(err) <= 2.0 * std::sqrt(p.variance + noise_var)) ++inside;
  }
  h.rmse = std::sqrt(se / m);
  h.within_two_sigma = static_cast<double>(inside) / m;
  return h;
}

TEST(GaussianProcess, Recovers1DFunctionWithCalibratedVariance) {
  const HeldOut h = fit_and_score(1, 25, 400, 0.05, [](const Eigen::VectorXd& x) { return f1(x(0)); }, 7);
  // The function spans about 2.4; noise sd is 0.05, so held-out error near the noise level means a good fit.
  EXPECT_LT(h.rmse, 0.1);
  EXPECT_GT(h.within_two_sigma, 0.88);
  EXPECT_LT(h.within_two_sigma, 0.995);  // not absurdly over-dispersed either
}

TEST(GaussianProcess, Recovers2DFunctionWithCalibratedVariance) {
  const HeldOut h =
      fit_and_score(2, 60, 400, 0.03, [](const Eigen::VectorXd& x) { return f2(x(0), x(1)); }, 11);
  EXPECT_LT(h.rmse, 0.1);
  EXPECT_GT(h.within_two_sigma, 0.88);
}

TEST(GaussianProcess, LearnsIrrelevantDimensionHasLongLengthScale) {
  // Only coordinate 0 matters: ARD should give coordinate 1 a much longer length scale.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Eigen::MatrixXd x(40, 2);
  Eigen::VectorXd y(40);
  for (int i = 0; i < 40; ++i) {
    x(i, 0) = u(rng);
    x(i, 1) = u(rng);
    y(i) = f1(x(i, 0));
  }
  GaussianProcess gp(2);
  gp.set_data(x, y);
  gp.fit();
  EXPECT_GT(gp.hyper().length_scales(1), 3.0 * gp.hyper().length_scales(0));
}

TEST(GaussianProcess, FitIncreasesMarginalLikelihood) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Eigen::MatrixXd x(20, 1);
  Eigen::VectorXd y(20);
  for (int i = 0; i < 20; ++i) {
    x(i, 0) = u(rng);
    y(i) = 100.0 + 10.0 * f1(x(i, 0));  // offset and scale exercise the output standardisation
  }
  GaussianProcess gp(1);
  gp.set_data(x, y);
  GpHyper poor;
  poor.length_scales = Eigen::VectorXd::Constant(1, 3.0);
  poor.signal_variance = 0.2;
  poor.noise_variance = 0.5;
  gp.set_hyper(poor);
  const double before = gp.log_marginal_likelihood();
  const double after = gp.fit();
  EXPECT_GT(after, before + 1.0);
  EXPECT_DOUBLE_EQ(after, gp.log_marginal_likelihood());
  EXPECT_NEAR(gp.log_marginal_likelihood(gp.hyper()), after, 1e-9);
}

TEST(GaussianProcess, AnalyticGradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Eigen::MatrixXd x(12, 2);
  Eigen::VectorXd y(12);
  for (int i = 0; i < 12; ++i) {
    x(i, 0) = u(rng);
    x(i, 1) = u(rng);
    y(i) = f2(x(i, 0), x(i, 1));
  }
  GaussianProcess gp(2);
  gp.set_data(x, y);
  Eigen::VectorXd theta(4);
  theta << std::log(0.4), std::log(0.7), std::log(1.3), std::log(0.05);
  Eigen::VectorXd grad;
  gp.negative_lml(theta, &grad);
  for (int i = 0; i < 4; ++i) {
    Eigen::VectorXd tp = theta, tm = theta;
    const double h = 1e-5;
    tp(i) += h;
    tm(i) -= h;
    const double fd = (gp.negative_lml(tp, nullptr) - gp.negative_lml(tm, nullptr)) / (2 * h);
    EXPECT_NEAR(grad(i), fd, 1e-4 * std::max(1.0, std::abs(fd))) << "parameter " << i;
  }
}

TEST(GaussianProcess, PredictionGradientMatchesFiniteDifferences) {
  Eigen::MatrixXd x(5, 2);
  x << 0.1, 0.2, 0.5, 0.9, 0.8, 0.4, 0.3, 0.6, 0.7, 0.1;
  Eigen::VectorXd y(5);
  y << 1.0, -0.5, 0.3, 2.0, 0.0;
  GaussianProcess gp(2);
  gp.set_data(x, y);
  Eigen::Vector2d p(0.42, 0.37);
  const GpPredictionGrad g = gp.predict_standardised(p);
  for (int i = 0; i < 2; ++i) {
    Eigen::Vector2d pp = p, pm = p;
    pp(i) += 1e-6;
    pm(i) -= 1e-6;
    const auto a = gp.predict_standardised(pp), b = gp.predict_standardised(pm);
    EXPECT_NEAR(g.d_mean(i), (a.mean - b.mean) / 2e-6, 1e-5);
    EXPECT_NEAR(g.d_variance(i), (a.variance - b.variance) / 2e-6, 1e-5);
  }
}

TEST(GaussianProcess, InterpolatesNoiselessDataAndSurvivesDuplicates) {
  Eigen::MatrixXd x(4, 1);
  x << 0.2, 0.2, 0.6, 0.9;  // a duplicated input: the kernel matrix is singular without noise or jitter
  Eigen::VectorXd y(4);
  y << 1.0, 1.0, 3.0, 2.0;
  GaussianProcess gp(1);
  gp.set_data(x, y);
  GpHyper h = gp.hyper();
  h.noise_variance = 1e-12;
  gp.set_hyper(h);
  EXPECT_NEAR(gp.predict(Eigen::VectorXd::Constant(1, 0.6)).mean, 3.0, 1e-3);
  EXPECT_LT(gp.predict(Eigen::VectorXd::Constant(1, 0.6)).variance, 1e-3);
  EXPECT_GT(gp.predict(Eigen::VectorXd::Constant(1, 0.4)).variance, 1e-3);
}

TEST(GaussianProcess, RejectsBadInputNamingTheCulprit) {
  GaussianProcess gp(2);
  Eigen::MatrixXd x(2, 2);
  x << 0.1, 0.2, 0.3, 1.5;
  Eigen::VectorXd y(2);
  y << 1.0, 2.0;
  try {
    gp.set_data(x, y);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("x(1,1)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gp.set_data(Eigen::MatrixXd(2, 3), y), InvalidArgument);
  EXPECT_THROW(GaussianProcess(0), InvalidArgument);
}

}  // namespace
}  // namespace commsched::tuner
