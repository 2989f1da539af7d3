#include "base/stats.h"

#include <cmath>
#include <iterator>
#include <numeric>
#include <string>

#include "base/types.h"

namespace commsched {

double student_t95(int dof) {
  static constexpr double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                     2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                     2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (dof < 1) throw InvalidArgument("student_t95: degrees of freedom " + std::to_string(dof) + " (must be >= 1)");
  if (dof <= int(std::size(table))) return table[dof - 1];
  // Beyond the table: the first two Cornish-Fisher terms of t around z = 1.959964.
  const double z = 1.959964, n = dof;
  return z + (z * z * z + z) / (4 * n) + (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * n * n);
}

MeanCi mean_ci95(std::span<const double> values) {
  MeanCi r;
  if (values.empty()) return r;
  const double n = double(values.size());
  r.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  if (values.size() < 2) return r;
  double var = 0;
  for (double x : values) var += (x - r.mean) * (x - r.mean);
  var /= n - 1;
  r.half_width = student_t95(int(values.size()) - 1) * std::sqrt(var / n);
  return r;
}

}  // namespace commsched
