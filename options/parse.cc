#include "options/parse.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace commsched {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Splits "12.5MiB" into 12.5 and "mib". Returns false when there is no leading number.
bool split_number(std::string_view s, double& number, std::string& unit) {
  const std::string t = trim(s);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.' || t[i] == 'e' || t[i] == 'E' ||
                          ((t[i] == '+' || t[i] == '-') && i > 0 && (t[i - 1] == 'e' || t[i - 1] == 'E')))) {
    // Do not swallow a unit that starts with 'e' ("1e" is not valid anyway; "exa" units are not supported).
    ++i;
  }
  if (i == 0) return false;
  const std::string num = t.substr(0, i);
  char* end = nullptr;
  number = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(number)) return false;
  unit = lower(trim(std::string_view(t).substr(i)));
  return true;
}

bool is_unlimited_word(const std::string& v) { return v == "inf" || v == "unlimited" || v == "none" || v == "max"; }

}  // namespace

void reject_value(std::string_view var, std::string_view value, std::string_view allowed) {
  throw InvalidArgument(std::string(var) + "='" + std::string(value) + "' is invalid: " + std::string(allowed));
}

std::string bytes_allowed(bool allow_unlimited) {
  return std::string("a positive size such as 4096, 512KiB, 4MiB, 1GB") +
         (allow_unlimited ? ", or inf/unlimited for no limit" : "");
}

std::string rate_allowed(bool allow_unlimited) {
  return std::string("a positive rate in bits per second such as 1Gbit, 10gbps, 100Mbit, 25G") +
         (allow_unlimited ? ", or 0/inf/unlimited for no limit" : "");
}

std::string seconds_allowed() { return "a non-negative duration such as 250ns, 5us, 1.5ms, 2s"; }

std::string int_allowed(int64_t min, int64_t max) {
  std::ostringstream allowed;
  allowed << "an integer in [" << min << ", " << max << "]";
  return allowed.str();
}

std::string double_allowed(double min, double max) {
  std::ostringstream allowed;
  allowed << "a number in [" << min << ", " << max << "]";
  return allowed.str();
}

std::string bool_allowed() { return "one of 1/0, true/false, yes/no, on/off"; }

uint64_t parse_bytes(std::string_view var, std::string_view value, bool allow_unlimited) {
  const std::string allowed = bytes_allowed(allow_unlimited);
  const std::string v = lower(trim(value));
  if (allow_unlimited && is_unlimited_word(v)) return 0;
  double n = 0;
  std::string unit;
  if (!split_number(v, n, unit) || n < 0) reject_value(var, value, allowed);
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "gb") mult = 1e9;
  else reject_value(var, value, allowed + " (unknown unit '" + unit + "')");
  const double bytes = n * mult;
  if (bytes > 1.8e19) reject_value(var, value, allowed + " (too large)");
  const auto out = static_cast<uint64_t>(std::llround(bytes));
  if (out == 0) reject_value(var, value, allowed);
  return out;
}

double parse_rate_bps(std::string_view var, std::string_view value, bool allow_unlimited) {
  const std::string allowed = rate_allowed(allow_unlimited);
  const std::string v = lower(trim(value));
  if (allow_unlimited && is_unlimited_word(v)) return 0;
  double n = 0;
  std::string unit;
  if (!split_number(v, n, unit) || n < 0) reject_value(var, value, allowed);
  for (const char* suffix : {"bit/s", "bps", "bit", "b/s"}) {
    const std::string sfx(suffix);
    if (unit.size() >= sfx.size() && unit.compare(unit.size() - sfx.size(), sfx.size(), sfx) == 0) {
      unit.resize(unit.size() - sfx.size());
      break;
    }
  }
  double mult = 0;
  if (unit.empty()) mult = 1;
  else if (unit == "k") mult = 1e3;
  else if (unit == "m") mult = 1e6;
  else if (unit == "g") mult = 1e9;
  else if (unit == "t") mult = 1e12;
  else reject_value(var, value, allowed);
  const double out = n * mult;
  if (out == 0 && !allow_unlimited) reject_value(var, value, allowed);
  return out;
}

double parse_seconds(std::string_view var, std::string_view value) {
  const std::string allowed = seconds_allowed();
  double n = 0;
  std::string unit;
  if (!split_number(value, n, unit) || n < 0) reject_value(var, value, allowed);
  if (unit.empty() || unit == "s") return n;
  if (unit == "ms") return n * 1e-3;
  if (unit == "us") return n * 1e-6;
  if (unit == "ns") return n * 1e-9;
  reject_value(var, value, allowed);
}

int64_t parse_int(std::string_view var, std::string_view value, int64_t min, int64_t max) {
  const std::string t = trim(value);
  int64_t out = 0;
  const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  if (t.empty() || ec != std::errc() || ptr != t.data() + t.size() || out < min || out > max)
    reject_value(var, value, int_allowed(min, max));
  return out;
}

double parse_double(std::string_view var, std::string_view value, double min, double max) {
  double n = 0;
  std::string unit;
  if (!split_number(value, n, unit) || !unit.empty() || n < min || n > max)
    reject_value(var, value, double_allowed(min, max));
  return n;
}

bool parse_bool(std::string_view var, std::string_view value) {
  const std::string v = lower(trim(value));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  reject_value(var, value, bool_allowed());
}

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  if (u == 0) os << bytes << " B";
  else {
    os.precision(v < 10 ? 2 : (v < 100 ? 3 : 4));
    os << v << ' ' << units[u];
  }
  return os.str();
}

std::string format_number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string format_rate(double bps) {
  if (bps >= 1e12) return format_number(bps / 1e12) + "Tbit";
  if (bps >= 1e9) return format_number(bps / 1e9) + "Gbit";
  if (bps >= 1e6) return format_number(bps / 1e6) + "Mbit";
  if (bps >= 1e3) return format_number(bps / 1e3) + "Kbit";
  return format_number(bps) + "bit";
}

std::string format_seconds(double s) {
  if (s == 0 || s >= 1) return format_number(s) + "s";
  if (s >= 1e-3) return format_number(s * 1e3) + "ms";
  if (s >= 1e-6) return format_number(s * 1e6) + "us";
  return format_number(s * 1e9) + "ns";
}

std::optional<std::string> env_value(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

}  // namespace commsched
