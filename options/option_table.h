// The option registry: every option of every layer is one row (name, environment variable, type and parser, default,
// allowed values, doc), registered by the layer that owns the struct it fills. From the rows come the struct's
// set(name, value) and from_env(), the CLI flags (`--name-with-dashes`), the Python init() keywords and the README
// table (`commsched options --markdown`).
//
// A table is plain data built once by its owner (a function-local const), not a mutable global: nothing registers
// itself behind the reader's back, and every table a program uses is listed in one catalogue (plugins/api/
// option_catalogue.h).
#pragma once

#include <algorithm>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "options/parse.h"

namespace commsched {

// What documentation, the CLI and Python see of one option.
struct OptionInfo {
  std::string group;                 // the struct it fills: "engine", "ps", "tuner", "collective", "context"
  std::string name;                  // set() key and Python keyword, lower case ("partition_bytes")
  std::vector<std::string> aliases;  // other accepted names (older CLI flags: "partition")
  std::string env;                   // environment variable ("COMMSCHED_PARTITION_BYTES")
  std::string type;                  // "size", "rate", "duration", "bool", "int", "number", "text", "choice", ...
  std::string default_value;         // as the parser reads it back
  std::string allowed;               // in the words errors use
  std::string doc;

  // "--partition-bytes": the name with dashes.
  std::string flag() const;
  bool answers_to(std::string_view name_or_alias) const;
};

// How text becomes a T, what is allowed and how a T prints (for defaults).
template <class T>
struct ValueType {
  std::string type;
  std::string allowed;
  std::function<T(std::string_view var, std::string_view value)> parse;
  std::function<std::string(const T&)> show;
};

// What a size of 0 means: not allowed, "no limit" (inf/unlimited/none), or "off" (0/off, and the unlimited words
// as before).
enum class ZeroSize { rejected, unlimited, off };
ValueType<uint64_t> size_value(ZeroSize zero = ZeroSize::rejected);
ValueType<double> rate_value(bool allow_unlimited = false);
ValueType<double> duration_value();
ValueType<int64_t> int_value(int64_t min, int64_t max);
ValueType<double> number_value(double min, double max);
ValueType<bool> bool_value();
ValueType<std::string> text_value(std::string what);
ValueType<std::string> choice_value(std::vector<std::string> choices);

// "a, b, c".
std::string join_names(const std::vector<std::string>& names);

// Another system's variable for one option (Horovod's HOROVOD_TIMELINE, BytePS's BYTEPS_PARTITION_BYTES), so that
// its job files keep their settings. `unit` is appended to the value (HOROVOD_CYCLE_TIME counts milliseconds).
struct ForeignVariable {
  std::string_view var, option, unit = {};
};

template <class Config>
class OptionTable {
 public:
  // Applies a value; `var` is what an error names (the environment variable, or the CLI flag).
  using Apply = std::function<void(Config&, const std::string& var, std::string_view value)>;

  // `what` names the table in errors ("engine" -> "unknown engine option 'x'").
  OptionTable(std::string group, std::string what) : group_(std::move(group)), what_(std::move(what)) {}

  // An option stored in the field `field(config)` returns a reference to; its default is that field of Config{}.
  template <class T, class Field>
  OptionTable& bind(std::string name, std::string env, Field field, ValueType<T> vt, std::string doc,
                    std::vector<std::string> aliases = {}) {
    Config defaults{};
    OptionInfo info{group_, std::move(name), std::move(aliases), std::move(env), vt.type,
                    vt.show(static_cast<T>(field(defaults))), vt.allowed, std::move(doc)};
    auto parse = vt.parse;
    return add(std::move(info), [field, parse](Config& c, const std::string& var, std::string_view value) {
      auto& target = field(c);
      target = static_cast<std::remove_reference_t<decltype(target)>>(parse(var, value));
    });
  }

  // An option whose application is more than storing one parsed field; info.group is filled in.
  OptionTable& add(OptionInfo info, Apply apply) {
    info.group = group_;
    entries_.push_back({std::move(info), std::move(apply)});
    return *this;
  }

  bool has(std::string_view name) const { return find(name) != nullptr; }

  // Applies one option by name or alias (case-insensitive); errors name `var`, by default the variable.
  void set(Config& c, std::string_view name, std::string_view value, std::string_view var = {}) const {
    const Entry* e = find(name);
    if (e == nullptr)
      throw InvalidArgument("unknown " + what_ + " option '" + std::string(name) + "' (allowed: " + join_names(names()) +
                            ")");
    e->apply(c, var.empty() ? e->info.env : std::string(var), value);
  }

  // Applies every option whose variable is set and not empty.
  void set_from_env(Config& c) const {
    for (const Entry& e : entries_)
      if (auto v = env_value(e.info.env)) e.apply(c, e.info.env, *v);
  }

  // Applies each foreign variable that is set where the option's own variable is not; errors name that variable.
  void set_from_foreign_env(Config& c, std::span<const ForeignVariable> vars) const {
    for (const ForeignVariable& f : vars) {
      const Entry* e = find(f.option);
      if (e == nullptr) throw std::logic_error("no " + what_ + " option '" + std::string(f.option) + "'");
      if (env_value(e->info.env)) continue;
      if (auto v = env_value(std::string(f.var))) e->apply(c, std::string(f.var), *v + std::string(f.unit));
    }
  }

  std::vector<OptionInfo> infos() const {
    std::vector<OptionInfo> out;
    for (const Entry& e : entries_) out.push_back(e.info);
    return out;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.info.name);
    return out;
  }
  const std::string& group() const { return group_; }

 private:
  struct Entry {
    OptionInfo info;
    Apply apply;
  };
  const Entry* find(std::string_view name) const {
    for (const Entry& e : entries_)
      if (e.info.answers_to(name)) return &e;
    return nullptr;
  }

  std::string group_, what_;
  std::vector<Entry> entries_;
};

}  // namespace commsched
