// The 95% interval of a mean, with Student's t: the one table of t quantiles in the project. C++ callers use it here;
// Python (bench scripts, examples) reaches the same code as commsched._C.mean_ci95.
#pragma once

#include <span>

namespace commsched {

// Two-sided 95% quantile of Student's t with `dof` degrees of freedom (>= 1): tabulated up to 30, then the
// Cornish-Fisher expansion around the normal quantile (within 0.001 of the exact value from 30 on).
double student_t95(int dof);

struct MeanCi {
  double mean = 0;
  double half_width = 0;  // of the two-sided 95% interval; 0 where there is no interval (fewer than two values)
};
// The mean of `values` and the half-width of its 95% interval (sample standard deviation, Student t).
MeanCi mean_ci95(std::span<const double> values);

}  // namespace commsched
