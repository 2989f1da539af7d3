#include "options/option_table.h"

#include <cctype>

namespace commsched {
namespace {

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trimmed_lower(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string OptionInfo::flag() const {
  std::string f = "--" + name;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

bool OptionInfo::answers_to(std::string_view n) const {
  std::string key = lower(n);
  std::replace(key.begin(), key.end(), '-', '_');  // "partition-bytes" as a flag name is the same option
  if (key == name) return true;
  for (const std::string& a : aliases)
    if (key == a) return true;
  return false;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

ValueType<uint64_t> size_value(ZeroSize zero) {
  ValueType<uint64_t> v;
  v.type = "size";
  switch (zero) {
    case ZeroSize::rejected:
      v.allowed = bytes_allowed(false);
      v.parse = [](std::string_view var, std::string_view value) { return parse_bytes(var, value); };
      v.show = [](const uint64_t& b) { return format_bytes(b); };
      break;
    case ZeroSize::unlimited:
      v.allowed = bytes_allowed(true);
      v.parse = [](std::string_view var, std::string_view value) { return parse_bytes(var, value, true); };
      v.show = [](const uint64_t& b) { return b == 0 ? std::string("unlimited") : format_bytes(b); };
      break;
    case ZeroSize::off:
      v.allowed = bytes_allowed(false) + ", or 0/off";
      v.parse = [](std::string_view var, std::string_view value) -> uint64_t {
        const std::string t = trimmed_lower(value);
        if (t == "0" || t == "off") return 0;
        return parse_bytes(var, value, true);
      };
      v.show = [](const uint64_t& b) { return b == 0 ? std::string("off") : format_bytes(b); };
      break;
  }
  return v;
}

ValueType<double> rate_value(bool allow_unlimited) {
  return {"rate", rate_allowed(allow_unlimited),
          [allow_unlimited](std::string_view var, std::string_view value) {
            return parse_rate_bps(var, value, allow_unlimited);
          },
          [](const double& bps) { return bps == 0 ? std::string("unlimited") : format_rate(bps); }};
}

ValueType<double> duration_value() {
  return {"duration", seconds_allowed(), [](std::string_view var, std::string_view value) { return parse_seconds(var, value); },
          [](const double& s) { return format_seconds(s); }};
}

ValueType<int64_t> int_value(int64_t min, int64_t max) {
  return {"int", int_allowed(min, max),
          [min, max](std::string_view var, std::string_view value) { return parse_int(var, value, min, max); },
          [](const int64_t& i) { return std::to_string(i); }};
}

ValueType<double> number_value(double min, double max) {
  return {"number", double_allowed(min, max),
          [min, max](std::string_view var, std::string_view value) { return parse_double(var, value, min, max); },
          [](const double& d) { return format_number(d); }};
}

ValueType<bool> bool_value() {
  return {"bool", bool_allowed(), [](std::string_view var, std::string_view value) { return parse_bool(var, value); },
          [](const bool& b) { return std::string(b ? "1" : "0"); }};
}

ValueType<std::string> text_value(std::string what) {
  return {"text", std::move(what), [](std::string_view, std::string_view value) { return std::string(value); },
          [](const std::string& s) { return s; }};
}

ValueType<std::string> choice_value(std::vector<std::string> choices) {
  const std::string allowed = "one of " + join_names(choices);
  return {"choice", allowed,
          [choices, allowed](std::string_view var, std::string_view value) {
            const std::string v = trimmed_lower(value);
            if (std::find(choices.begin(), choices.end(), v) == choices.end()) reject_value(var, value, allowed);
            return v;
          },
          [](const std::string& s) { return s; }};
}

}  // namespace commsched
