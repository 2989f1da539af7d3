#include "workload/profile.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#ifndef COMMSCHED_PROFILES_DIR
#define COMMSCHED_PROFILES_DIR ""
#endif
#ifndef COMMSCHED_INSTALLED_PROFILES_DIR
#define COMMSCHED_INSTALLED_PROFILES_DIR ""
#endif

namespace commsched::sim {

uint64_t ModelProfile::total_bytes() const {
  uint64_t n = 0;
  for (const TensorProfile& t : tensors) n += t.bytes();
  return n;
}

Nanos ModelProfile::compute_per_iteration() const {
  Nanos n = 0;
  for (const LayerProfile& l : layers) n += l.forward + l.backward;
  return n;
}

void ModelProfile::finalize() {
  layers.clear();
  int32_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorProfile& t = tensors[i];
    if (layers.empty() || t.layer != current) {
      if (!layers.empty() && t.layer < current)
        throw InvalidArgument("profile '" + name + "': tensor '" + t.name + "' has layer " + std::to_string(t.layer) +
                              " after layer " + std::to_string(current) + " (tensors must be in forward order)");
      layers.emplace_back();
      current = t.layer;
    }
    LayerProfile& l = layers.back();
    l.forward += t.forward;
    l.backward += t.backward;
    l.tensors.push_back(i);
  }
}

namespace {

Nanos ms_to_ns(double ms, const std::string& where) {
  if (!(ms >= 0) || !std::isfinite(ms)) throw InvalidArgument(where + ": time must be a finite number of ms >= 0");
  return static_cast<Nanos>(std::llround(ms * 1e6));
}

// A whole number of the profile. nlohmann converts a number such as 1e82 to an integer type with a plain cast,
// undefined when out of range (UBSan, found by fuzz_profile_json): anything but an integer in range is refused.
int64_t whole_number(const nlohmann::json& j, const std::string& key, int64_t min, int64_t max, const std::string& who) {
  const nlohmann::json& v = j.at(key);
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(max)
                                           : v.is_number_integer() && v.get<int64_t>() >= min && v.get<int64_t>() <= max;
  if (!fits)
    throw InvalidArgument(who + ": '" + key + "' must be a whole number in [" + std::to_string(min) + ", " +
                          std::to_string(max) + "], not " + v.dump());
  return v.get<int64_t>();
}

TensorProfile parse_tensor(const nlohmann::json& j, const std::string& where) {
  TensorProfile t;
  t.name = j.at("name").get<std::string>();
  const std::string who = where + " tensor '" + t.name + "'";
  t.layer = static_cast<int32_t>(whole_number(j, "layer", INT32_MIN, INT32_MAX, who));
  t.dtype = parse_dtype(j.value("dtype", std::string("f32")));
  const int64_t elements = whole_number(j, "elements", INT64_MIN, INT64_MAX, who);
  if (elements < 0) throw InvalidArgument(who + ": negative element count");
  t.elements = static_cast<uint64_t>(elements);
  t.forward = ms_to_ns(j.value("forward_ms", 0.0), who + " forward_ms");
  t.backward = ms_to_ns(j.value("backward_ms", 0.0), who + " backward_ms");
  return t;
}

}  // namespace

ModelProfile parse_profile(const std::string& json_text, const std::string& origin) {
  ModelProfile p;
  try {
    const nlohmann::json j = nlohmann::json::parse(json_text);
    p.name = j.value("name", origin);
    p.source = j.value("source", std::string());
    if (j.contains("batch_size"))
      p.batch_size = static_cast<int>(whole_number(j, "batch_size", 0, INT32_MAX, "profile " + origin));
    const auto& tensors = j.at("tensors");
    for (size_t i = 0; i < tensors.size(); ++i)
      p.tensors.push_back(parse_tensor(tensors[i], origin + " entry " + std::to_string(i)));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("profile " + origin + ": " + e.what());
  }
  if (p.tensors.empty()) throw InvalidArgument("profile " + origin + ": no tensors");
  p.finalize();
  return p;
}

std::string resolve_profile_path(const std::string& name_or_path, const std::vector<std::string>& first_dirs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) return name_or_path;
  std::vector<std::string> dirs = first_dirs;
  for (const char* dir : {COMMSCHED_PROFILES_DIR, COMMSCHED_INSTALLED_PROFILES_DIR})
    if (*dir != '\0') dirs.emplace_back(dir);
  std::vector<std::string> names;
  for (const std::string& dir : dirs) {
    if (dir.empty()) continue;
    const fs::path p = fs::path(dir) / (name_or_path + ".json");
    if (fs::is_regular_file(p, ec)) return p.string();
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::string searched, found;
  for (const std::string& d : dirs) searched += (searched.empty() ? "" : ", ") + d;
  for (const std::string& n : names) found += (found.empty() ? "" : ", ") + n;
  throw InvalidArgument("model profile '" + name_or_path + "' not found: not a file, and no " + name_or_path +
                        ".json in " + (searched.empty() ? "any profile folder" : searched) +
                        " (give a path to a profile JSON file or one of: " + (found.empty() ? "none found" : found) +
                        ")");
}

ModelProfile load_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot open profile '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return parse_profile(text.str(), "'" + path + "'");
}

ModelProfile make_profile(std::string name, std::vector<TensorProfile> tensors) {
  ModelProfile p;
  p.name = std::move(name);
  p.tensors = std::move(tensors);
  p.finalize();
  return p;
}

}  // namespace commsched::sim
