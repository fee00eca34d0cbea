// Tree-walking evaluator with jinja2's scoping (internal to src/template).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "template/ast.h"
#include "template/value.h"

namespace bonsai::tpl {

// Variables of one jinja2 frame. Scopes are owned by the C++ frame that opened them and freed when
// it ends, unless a macro (or a recursive loop) captured them: then the Interp keeps them (and so
// their ancestors, also marked captured) until the render ends. Raw parent pointers, no cycles.
struct Scope {
  Scope* parent = nullptr;
  bool captured = false;
  std::vector<std::pair<std::string, Value>> vars;
  explicit Scope(Scope* p) : parent(p) {}
  void capture() {
    for (Scope* s = this; s && !s->captured; s = s->parent) s->captured = true;
  }
  const Value* find_local(std::string_view name) const {
    for (const auto& kv : vars)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& kv : vars)
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = Scope*;

struct Namespace : Object {
  Dict attrs;
  std::string type_name() const override { return "Namespace"; }
  std::string module() const override { return "jinja2.utils"; }
  std::string repr() const override;
  bool get_attr(const std::string& name, Value& out) const override;
};

struct MacroObj : Object {
  std::shared_ptr<const MacroDef> def;
  ScopePtr closure;
  std::string type_name() const override { return "Macro"; }
  std::string module() const override { return "jinja2.runtime"; }
  std::string repr() const override;
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override;
};

struct BuiltinFn : Object {
  std::string name;
  Value (*fn)(Interp& in, CallArgs& args) = nullptr;
  std::string type_name() const override { return "function"; }
  std::string repr() const override { return "<function " + name + ">"; }
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override { return fn(in, args); }
};

// A method looked up on a value (str.split, dict.items, loop.cycle, ...), called later.
struct BoundMethod : Object {
  Value self;
  std::string name;
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override;
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override;
};

struct LoopObj : Object {
  const Stmt* stmt = nullptr;  // the for statement (recursive loops)
  ScopePtr outer;              // scope the loop runs in (recursive loops)
  std::shared_ptr<const List> items;
  size_t index0 = 0;
  int depth0 = 0;
  bool has_changed = false;
  Value last_changed;
  std::string type_name() const override { return "LoopContext"; }
  std::string module() const override { return "jinja2.runtime"; }
  std::string repr() const override;
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override;
  bool get_attr(const std::string& name, Value& out) const override;
  std::weak_ptr<LoopObj> self;
};

enum class Flow { Normal, Break, Continue };

class Interp {
 public:
  Interp(const Program& prog, Value context);
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;
  std::string run();

  // Sandboxed attribute / item access (jinja2 ImmutableSandboxedEnvironment rules).
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value call_value(const Value& fn, CallArgs& args);
  Value call_filter(const std::string& name, const Value& v, CallArgs& args);
  bool call_test(const std::string& name, const Value& v, CallArgs& args);
  Value invoke_macro(const MacroObj& m, CallArgs& args);
  std::string run_loop(const Stmt& s, const ScopePtr& scope, const Value* iterable, int depth0);
  int line() const { return line_; }
  void track(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }
  Scope* open_scope(Scope* parent) { return new Scope(parent); }
  void close_scope(Scope* s);

 private:
  const Program& prog_;
  ScopePtr root_ = nullptr;
  std::vector<std::unique_ptr<Scope>> kept_;          // captured scopes, freed with the Interp
  std::vector<std::weak_ptr<Namespace>> namespaces_;  // cleared at the end (they may form cycles)
  int line_ = 0;
  int depth_ = 0;
  const char* stack_top_ = nullptr;  // address of a local in run(): bounds the C++ stack used

  void check_stack() const;
  const Value* filter_input_ = nullptr;  // input of {% filter %} / {% set x | f %} chains

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out, const Value* iterable, int depth0);
  void assign(const Target& t, const Value& v, const ScopePtr& scope);
  Value lookup(const std::string& name, const ScopePtr& scope);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller);
  void eval_args(const CallSpec& c, const ScopePtr& scope, CallArgs& out);
  Value apply_filter_chain(const Expr& e, const ScopePtr& scope, const Value& input);
};

// Binary operators with Python semantics (also used by filters / tests).
Value binop(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);
Value call_method(Interp& in, const Value& self, const std::string& name, CallArgs& args);
// Names that are methods of a Python str / dict / list value (attribute lookup hits them first).
bool is_method_of(const Value& v, const std::string& name);
bool is_unsafe_method_of(const Value& v, const std::string& name);
Value global_function(const std::string& name);  // range, dict, namespace, raise_exception, ...
std::string py_percent_format(const std::string& fmt, const Value& args);

}  // namespace bonsai::tpl
