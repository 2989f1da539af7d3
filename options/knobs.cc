#include "options/knobs.h"

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <sstream>

namespace commsched {
namespace {

constexpr uint64_t kOneBatchInFlight = 1;  // a credit below any partition (scheduler/auto_knobs.h)

uint64_t of_value(const KnobSpec& row, const Knobs& k) {
  return row.tuning.scale == KnobScale::log_multiple ? k.*registered_knob(row.tuning.of).field : 0;
}

std::string upper(std::string_view s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// "--small-tensor": the CLI spells a name with dashes.
std::string cli_flag(std::string_view name) {
  std::string f = "--" + std::string(name);
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// A grid or bound in the row's unit, as the README reads it.
std::string unit_value(const KnobSpec& row, double v) {
  if (row.tuning.scale == KnobScale::log_multiple) return v == 0 ? "one batch" : number(v) + "x";
  return v == 0 ? std::string(row.zero == ZeroSize::off ? "off" : "unlimited") : format_bytes(uint64_t(v));
}

std::string grid_text(const KnobSpec& row, const KnobGrid& g) {
  std::string out;
  for (double v : g.values) out += (out.empty() ? "" : ", ") + unit_value(row, v);
  if (g.tune_min > 0 || g.tune_max > 0)
    out += "; --tune " + unit_value(row, g.tune_min > 0 ? g.tune_min : row.tuning.min) + " .. " +
           unit_value(row, g.tune_max > 0 ? g.tune_max : row.tuning.max);
  return out;
}

std::string axis_text(const KnobSpec& row) {
  const KnobTuning& t = row.tuning;
  switch (t.scale) {
    case KnobScale::fixed: return "not searched";
    case KnobScale::log_bytes:
      return std::string(t.off_band ? "off, or " : "") + "log " + unit_value(row, t.min) + " .. " +
             unit_value(row, t.max) + " (multiples of " + format_bytes(t.alignment) + ")";
    case KnobScale::log_multiple:
      return std::string(t.one_batch_band ? "one batch in flight, or " : "") + "log " + number(t.min) + "x .. " +
             number(t.max) + "x `" + std::string(t.of) + "`" + (t.unlimited_band ? ", or unlimited" : "");
  }
  return "";
}

std::string bound_options(const KnobSpec& row) {
  const std::string stem = "`COMMSCHED_TUNER_";
  const std::string a = upper(row.alias);
  switch (row.tuning.scale) {
    case KnobScale::fixed: return "";
    case KnobScale::log_bytes: return stem + "MIN_" + a + "`, " + stem + "MAX_" + a + "`";
    case KnobScale::log_multiple:
      return stem + "MAX_" + a + "_MULTIPLE`" + (row.tuning.unlimited_band ? ", " + stem + "UNLIMITED_" + a + "`" : "");
  }
  return "";
}

}  // namespace

uint64_t knob_value_from_grid(const KnobSpec& row, double value, const Knobs& k) {
  if (row.tuning.scale != KnobScale::log_multiple) return static_cast<uint64_t>(value);
  // A credit below one partition still lets one batch go when nothing is in flight: one message at a time.
  return std::max<uint64_t>(kOneBatchInFlight, static_cast<uint64_t>(double(of_value(row, k)) * value));
}

double knob_grid_value(const KnobSpec& row, const Knobs& k) {
  const uint64_t v = k.*row.field;
  if (row.tuning.scale != KnobScale::log_multiple) return double(v);
  const uint64_t base = of_value(row, k);
  if (v == 0 || base == 0) return 1e6;  // no limit in practice
  if (v < base) return 0;
  return double(v) / double(base);
}

std::string describe_knob(const KnobSpec& row, const Knobs& k) {
  const uint64_t v = k.*row.field;
  if (v == 0) return row.zero == ZeroSize::off ? "off" : "unlimited";
  if (row.tuning.scale != KnobScale::log_multiple) return format_bytes(v);
  const uint64_t base = of_value(row, k);
  if (base > 0 && v < base) return "one batch in flight";
  std::ostringstream m;
  m << format_bytes(v) << " (" << std::setprecision(3) << double(v) / double(std::max<uint64_t>(base, 1)) << "x)";
  return m.str();
}

std::string describe_knobs(const Knobs& k, std::span<const KnobSpec> rows) {
  std::string out;
  for (const KnobSpec& row : rows) out += (out.empty() ? "" : ", ") + std::string(row.alias) + " " + describe_knob(row, k);
  return out;
}

std::string knobs_markdown() {
  std::string out =
      "| Knob | Option, CLI | Default | Tuner's axis | Tuner's bounds | Simulator grid: parameter server | "
      "Simulator grid: all-reduce | Grid flag |\n|---|---|---|---|---|---|---|---|\n";
  for (const KnobSpec& row : kKnobs) {
    const ValueType<uint64_t> size = size_value(row.zero);
    out += "| `" + std::string(row.name) + "` | `COMMSCHED_" + upper(row.name) + "`, `" + cli_flag(row.alias) +
           "` | `" + size.show(knob_default(row)) + "` | " + axis_text(row) + " | " + bound_options(row) + " | " +
           grid_text(row, row.ps) + " | " + grid_text(row, row.allreduce) + " | `--" + std::string(row.grid_flag) +
           "` |\n";
  }
  return out;
}

}  // namespace commsched
