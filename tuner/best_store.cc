#include "tuner/best_store.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "scheduler/config.h"

namespace commsched::tuner {
namespace {

using nlohmann::json;

json read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json::object();  // no file yet: an empty store
  try {
    json j = json::parse(in);
    if (!j.is_object() || !j.contains("entries") || !j["entries"].is_object()) {
      throw std::runtime_error("missing \"entries\" object");
    }
    return j;
  } catch (const std::exception& e) {
    throw std::runtime_error("tuner store " + path + " is malformed: " + e.what());
  }
}

}  // namespace

std::string TuningKey::str() const {
  std::ostringstream s;
  s << "model=" << std::hex << std::setw(16) << std::setfill('0') << model_signature << std::dec
    << "/workers=" << workers << "/servers=" << servers << "/backend=" << backend;
  return s.str();
}

uint64_t model_signature(std::span<const uint64_t> tensor_bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t v : tensor_bytes) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

BestStore::BestStore(std::string path) : path_(std::move(path)) {}

std::optional<StoredBest> BestStore::load(const TuningKey& key) const {
  const json j = read_file(path_);
  if (!j.contains("entries")) return std::nullopt;
  const auto& entries = j["entries"];
  const auto it = entries.find(key.str());
  if (it == entries.end()) return std::nullopt;
  try {
    StoredBest b;
    for (const KnobSpec& k : kKnobs) b.knobs.*k.field = it->at(std::string(k.name)).get<uint64_t>();  // the knob set
    b.score = it->value("score", 0.0);
    b.trials = it->value("trials", 0);
    return b;
  } catch (const std::exception& e) {
    throw std::runtime_error("tuner store " + path_ + ": entry " + key.str() + " is malformed: " + e.what());
  }
}

void BestStore::save(const TuningKey& key, const StoredBest& best) const {
  json j = read_file(path_);
  if (!j.contains("entries")) j = json{{"version", 1}, {"entries", json::object()}};
  json entry = json{{"score", best.score},
                     {"trials", best.trials},
                     {"workers", key.workers},
                     {"servers", key.servers},
                     {"backend", key.backend}};
  for (const KnobSpec& k : kKnobs) entry[std::string(k.name)] = best.knobs.*k.field;
  j["entries"][key.str()] = std::move(entry);
  // Write beside the target and rename, so a crash mid-write never leaves a truncated store for the next run.
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << '\n';
    if (!out) throw std::runtime_error("cannot write tuner store " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) throw std::runtime_error("cannot replace tuner store " + path_ + ": " + ec.message());
}

}  // namespace commsched::tuner
