#include "template/interp.h"

#include <cmath>

#include "template/chat_template.h"
#include "template/unicode.h"

namespace bonsai::tpl {

// ---- objects ------------------------------------------------------------------------------

std::string Namespace::repr() const {
  Value d = Value::make_dict(attrs);
  return "<Namespace " + tpl::repr(d) + ">";
}

bool Namespace::get_attr(const std::string& name, Value& out) const {
  if (const Value* v = attrs.find(name)) {
    out = *v;
    return true;
  }
  return false;
}

std::string MacroObj::repr() const { return def->anonymous ? "<Macro anonymous>" : "<Macro " + repr_str(def->name) + ">"; }

Value MacroObj::call(Interp& in, CallArgs& args) { return in.invoke_macro(*this, args); }

Value BoundMethod::call(Interp& in, CallArgs& args) { return call_method(in, self, name, args); }

std::string LoopObj::repr() const {
  return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items->size()) + ">";
}

Value LoopObj::call(Interp& in, CallArgs& args) {
  if (!stmt || !stmt->recursive)
    py_raise("TypeError", "The loop must have the 'recursive' marker to be called recursively.");
  if (args.pos.size() != 1 || !args.kw.empty()) py_raise("TypeError", "loop() takes exactly one argument");
  return Value::string(in.run_loop(*stmt, outer, &args.pos[0], depth0 + 1));
}

bool LoopObj::get_attr(const std::string& name, Value& out) const {
  int64_t n = static_cast<int64_t>(items->size());
  int64_t i = static_cast<int64_t>(index0);
  if (name == "index") out = Value::integer(i + 1);
  else if (name == "index0") out = Value::integer(i);
  else if (name == "revindex") out = Value::integer(n - i);
  else if (name == "revindex0") out = Value::integer(n - i - 1);
  else if (name == "first") out = Value::boolean(i == 0);
  else if (name == "last") out = Value::boolean(i == n - 1);
  else if (name == "length") out = Value::integer(n);
  else if (name == "depth") out = Value::integer(depth0 + 1);
  else if (name == "depth0") out = Value::integer(depth0);
  else if (name == "previtem")
    out = i > 0 ? (*items)[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item");
  else if (name == "nextitem")
    out = i + 1 < n ? (*items)[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item");
  else if (name == "cycle" || name == "changed") {
    auto m = std::make_shared<BoundMethod>();
    m->self = Value::object(self.lock());
    m->name = name;
    out = Value::object(std::move(m));
  } else {
    return false;
  }
  return true;
}

// ---- operators ----------------------------------------------------------------------------

namespace {

[[noreturn]] void unsupported_operands(const std::string& op, const Value& a, const Value& b) {
  py_raise("TypeError", "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Value repeat(const Value& seq, int64_t n) {
  bool empty = seq.is_string() ? seq.s.empty() : seq.list->empty();
  if (empty || n <= 0) return seq.is_string() ? Value::string("", seq.flag) : Value::make_list({}, seq.flag);
  if (seq.is_string()) {
    std::string out;
    if (n > 0) {
      if (static_cast<double>(seq.s.size()) * static_cast<double>(n) > 1e8) py_raise("MemoryError", "string too large");
      out.reserve(seq.s.size() * static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) out += seq.s;
    }
    return Value::string(std::move(out), seq.flag);
  }
  List out;
  if (n > 0) {
    if (static_cast<double>(seq.list->size()) * static_cast<double>(n) > 1e8) py_raise("MemoryError", "list too large");
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  }
  return Value::make_list(std::move(out), seq.flag);
}

// Python float divmod.
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

}  // namespace

Value binop(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (op == "%" && a.is_string()) return Value::string(py_percent_format(a.s, b), a.flag);
  if (b.is_undefined()) fail_undefined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = a.is_intlike() && b.is_intlike();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) py_raise("OverflowError", "integer overflow");
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (a.flag || b.flag) {
        std::string l = a.flag ? a.s : escape_html(a.s);
        std::string r = b.flag ? b.s : escape_html(b.s);
        return Value::string(l + r, true);
      }
      return Value::string(a.s + b.s);
    }
    if (a.is_seq() && b.is_seq() && a.flag == b.flag) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(out), a.flag);
    }
    if (a.is_string() && !a.flag)
      py_raise("TypeError", "can only concatenate str (not \"" + type_name(b) + "\") to str");
    if (a.is_seq())
      py_raise("TypeError", "can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    unsupported_operands("+", a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) py_raise("OverflowError", "integer overflow");
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() - b.as_double());
    unsupported_operands("-", a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) py_raise("OverflowError", "integer overflow");
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() * b.as_double());
    if (a.is_markup() && !b.is_intlike())
      py_raise("TypeError", "'" + type_name(b) + "' object cannot be interpreted as an integer");
    if (b.is_markup() && !a.is_intlike())
      py_raise("TypeError", "'" + type_name(a) + "' object cannot be interpreted as an integer");
    if ((a.is_string() || a.is_seq()) && b.is_intlike()) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_seq()) && a.is_intlike()) return repeat(b, a.as_int());
    if (a.is_string() || a.is_seq())
      py_raise("TypeError", "can't multiply sequence by non-int of type '" + type_name(b) + "'");
    if (b.is_string() || b.is_seq())
      py_raise("TypeError", "can't multiply sequence by non-int of type '" + type_name(a) + "'");
    unsupported_operands("*", a, b);
  }
  if (op == "/") {
    if (!nums) unsupported_operands("/", a, b);
    if (b.as_double() == 0.0) py_raise("ZeroDivisionError", ints ? "division by zero" : "float division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!nums) unsupported_operands("//", a, b);
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) py_raise("ZeroDivisionError", "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) py_raise("OverflowError", "integer overflow");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::integer(q);
    }
    if (b.as_double() == 0.0) py_raise("ZeroDivisionError", "float floor division by zero");
    double fd, md;
    float_divmod(a.as_double(), b.as_double(), fd, md);
    return Value::number(fd);
  }
  if (op == "%") {
    if (a.is_string()) {
      std::string r = py_percent_format(a.s, b);
      return Value::string(std::move(r), a.flag);
    }
    if (!nums) unsupported_operands("%", a, b);
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) py_raise("ZeroDivisionError", "integer modulo by zero");
      if (y == -1) return Value::integer(0);
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::integer(m);
    }
    if (b.as_double() == 0.0) py_raise("ZeroDivisionError", "float modulo");
    double fd, md;
    float_divmod(a.as_double(), b.as_double(), fd, md);
    return Value::number(md);
  }
  if (op == "**") {
    if (!nums) unsupported_operands("** or pow()", a, b);
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), r = 1;
      while (e > 0) {
        if (e & 1) {
          if (__builtin_mul_overflow(r, base, &r)) py_raise("OverflowError", "integer overflow");
        }
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) py_raise("OverflowError", "integer overflow");
      }
      return Value::integer(r);
    }
    double x = a.as_double(), y = b.as_double();
    if (x == 0.0 && y < 0) py_raise("ZeroDivisionError", "0.0 cannot be raised to a negative power");
    if (x < 0 && std::floor(y) != y) py_raise("ValueError", "complex results are not supported");
    double r = std::pow(x, y);
    if (std::isinf(r) && !std::isinf(x)) py_raise("OverflowError", "(34, 'Numerical result out of range')");
    return Value::number(r);
  }
  py_raise("TypeError", "unknown operator " + op);
}

bool contains(const Value& c, const Value& item) {
  switch (c.type) {
    case Type::Undefined: return false;
    case Type::String:
      if (!item.is_string())
        py_raise("TypeError", "'in <string>' requires string as left operand, not " + type_name(item));
      return c.s.find(item.s) != std::string::npos;
    case Type::List:
      for (const Value& x : *c.list)
        if (equals(x, item)) return true;
      return false;
    case Type::Dict:
      if (item.is_seq() && !item.is_tuple()) py_raise("TypeError", "unhashable type: 'list'");
      if (item.is_dict()) py_raise("TypeError", "unhashable type: 'dict'");
      if (!item.is_string()) return false;
      return c.dict->find(item.s) != nullptr;
    case Type::Object:
      if (c.as<IterObj>()) {
        for (const Value& x : iterate(c))
          if (equals(x, item)) return true;
        return false;
      }
      [[fallthrough]];
    default: py_raise("TypeError", "argument of type '" + type_name(c) + "' is not iterable");
  }
}

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto idx = [](const Value& v, bool& given) -> int64_t {
    given = !v.is_none() && !v.is_undefined();
    if (!given) return 0;
    if (!v.is_intlike()) py_raise("TypeError", "slice indices must be integers or None or have an __index__ method");
    return v.as_int();
  };
  bool has_start, has_stop, has_step;
  int64_t st = idx(start, has_start), sp = idx(stop, has_stop), stp = idx(step, has_step);
  if (!has_step) stp = 1;
  if (stp == 0) py_raise("ValueError", "slice step cannot be zero");
  if (!obj.is_string() && !obj.is_seq()) {
    std::string r = "slice(" + (has_start ? std::to_string(st) : "None") + ", " +
                    (has_stop ? std::to_string(sp) : "None") + ", " + (has_step ? std::to_string(stp) : "None") + ")";
    return Value::undefined(object_type_repr(obj) + " has no element " + r);
  }
  std::u32string cps;
  int64_t len;
  if (obj.is_string()) {
    cps = uni::decode(obj.s);
    len = static_cast<int64_t>(cps.size());
  } else {
    len = static_cast<int64_t>(obj.list->size());
  }
  auto adjust = [&](int64_t v, bool given, bool is_start) -> int64_t {
    if (!given) {
      if (stp < 0) return is_start ? len - 1 : -1;
      return is_start ? 0 : len;
    }
    if (v < 0) {
      v += len;
      if (v < 0) v = stp < 0 ? -1 : 0;
    } else if (v >= len) {
      v = stp < 0 ? len - 1 : len;
    }
    return v;
  };
  int64_t a = adjust(st, has_start, true), b = adjust(sp, has_stop, false);
  std::vector<int64_t> picks;
  if (stp > 0) {
    for (int64_t k = a; k < b; k += stp) picks.push_back(k);
  } else {
    for (int64_t k = a; k > b; k += stp) picks.push_back(k);
  }
  if (obj.is_string()) {
    std::u32string out;
    out.reserve(picks.size());
    for (int64_t k : picks) out.push_back(cps[static_cast<size_t>(k)]);
    return Value::string(uni::encode(out), obj.flag);
  }
  List out;
  out.reserve(picks.size());
  for (int64_t k : picks) out.push_back((*obj.list)[static_cast<size_t>(k)]);
  return Value::make_list(std::move(out), obj.flag);
}

// ---- interpreter --------------------------------------------------------------------------

namespace {
// Opens a scope for the current C++ frame; closes it (frees it unless captured) on exit.
class LocalScope {
 public:
  LocalScope(Interp& in, Scope* parent) : in_(in), s_(in.open_scope(parent)) {}
  ~LocalScope() { in_.close_scope(s_); }
  LocalScope(const LocalScope&) = delete;
  LocalScope& operator=(const LocalScope&) = delete;
  Scope* get() const { return s_; }

 private:
  Interp& in_;
  Scope* s_;
};
}  // namespace

void Interp::close_scope(Scope* s) {
  if (s->captured)
    kept_.emplace_back(s);
  else
    delete s;
}

Interp::~Interp() {
  for (auto& w : namespaces_)
    if (auto ns = w.lock()) ns->attrs.items.clear();
  for (auto& s : kept_) s->vars.clear();
  if (root_) {
    root_->vars.clear();
    delete root_;
  }
}

namespace {
void mark_missing(Scope* s, const std::vector<std::string>& names) {
  for (const auto& n : names) s->set(n, Value::undefined(repr_str(n) + " is undefined"));
}
}  // namespace

Interp::Interp(const Program& prog, Value context) : prog_(prog) {
  root_ = new Scope(nullptr);
  root_->captured = true;
  if (context.is_dict())
    for (const auto& kv : context.dict->items) root_->vars.emplace_back(kv.first, kv.second);
  mark_missing(root_, prog.undefined_at_entry);
}

namespace {
constexpr int kMaxMacroDepth = 256;               // Python's recursion limit stops jinja2 near ~200
constexpr std::ptrdiff_t kStackBudget = 3 << 20;  // bytes of C++ stack one render may use
}  // namespace

void Interp::check_stack() const {
  char here;
  if (stack_top_ && stack_top_ - &here > kStackBudget)
    py_raise("RecursionError", "maximum recursion depth exceeded (template too deeply nested)");
}

std::string Interp::run() {
  std::string out;
  char top;
  stack_top_ = &top;
  try {
    exec(prog_.body, root_, out);
  } catch (const PyError& e) {
    std::string detail = e.type == "UndefinedError" || e.type == "TemplateRuntimeError" || e.type == "SecurityError"
                             ? e.message
                             : e.type + ": " + e.message;
    throw TemplateError(TemplateError::Kind::Runtime, detail, line_, 0);
  }
  return out;
}

Value Interp::lookup(const std::string& name, const ScopePtr& scope) {
  for (Scope* s = scope; s; s = s->parent)
    if (const Value* v = s->find_local(name)) return *v;
  Value g = global_function(name);
  if (!g.is_undefined()) return g;
  return Value::undefined(repr_str(name) + " is undefined");
}

Flow Interp::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

void Interp::assign(const Target& t, const Value& v, const ScopePtr& scope) {
  switch (t.kind) {
    case Target::Name: scope->set(t.name, v); return;
    case Target::Tuple: {
      if (v.is_undefined()) fail_undefined(v);
      List items = iterate(v);
      size_t want = t.items.size();
      if (items.size() < want)
        py_raise("ValueError", "not enough values to unpack (expected " + std::to_string(want) + ", got " +
                                   std::to_string(items.size()) + ")");
      if (items.size() > want) py_raise("ValueError", "too many values to unpack (expected " + std::to_string(want) + ")");
      for (size_t k = 0; k < want; ++k) assign(t.items[k], items[k], scope);
      return;
    }
    case Target::NSRef: {
      Value ns = lookup(t.name, scope);
      Namespace* n = ns.as<Namespace>();
      if (!n) py_raise("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
      n->attrs.set(t.attr, v);
      return;
    }
  }
}

Flow Interp::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  line_ = s.line;
  switch (s.kind) {
    case SK::Text: out += s.text; return Flow::Normal;
    case SK::Output:
      for (const auto& e : s.exprs) {
        Value v = eval(*e, scope);
        if (v.is_string())
          out += v.s;
        else
          out += to_str(v);
      }
      return Flow::Normal;
    case SK::If: {
      for (size_t k = 0; k < s.exprs.size(); ++k) {
        if (truthy(eval(*s.exprs[k], scope))) return exec(s.bodies[k], scope, out);
      }
      if (s.has_else) return exec(s.bodies.back(), scope, out);
      return Flow::Normal;
    }
    case SK::For: return exec_for(s, scope, out, nullptr, 0);
    case SK::Set: assign(s.target, eval(*s.expr, scope), scope); return Flow::Normal;
    case SK::SetBlock: {
      std::string body;
      {
        LocalScope inner(*this, scope);
        mark_missing(inner.get(), s.undefined_at_entry[0]);
        exec(s.bodies[0], inner.get(), body);
      }
      Value v = Value::string(std::move(body));
      if (s.expr) v = apply_filter_chain(*s.expr, scope, v);
      assign(s.target, v, scope);
      return Flow::Normal;
    }
    case SK::Macro: {
      auto m = std::make_shared<MacroObj>();
      m->def = s.macro;
      m->closure = scope;
      scope->capture();
      scope->set(s.macro->name, Value::object(std::move(m)));
      return Flow::Normal;
    }
    case SK::CallBlock: {
      auto caller = std::make_shared<MacroObj>();
      caller->def = s.macro;
      caller->closure = scope;
      scope->capture();
      Value cv = Value::object(std::move(caller));
      out += to_str(eval_call(*s.expr, scope, &cv));
      return Flow::Normal;
    }
    case SK::FilterBlock: {
      std::string body;
      {
        LocalScope inner(*this, scope);
        mark_missing(inner.get(), s.undefined_at_entry[0]);
        exec(s.bodies[0], inner.get(), body);
      }
      out += to_str(apply_filter_chain(*s.expr, scope, Value::string(std::move(body))));
      return Flow::Normal;
    }
    case SK::With: {
      std::vector<Value> vals;
      for (const auto& e : s.exprs) vals.push_back(eval(*e, scope));
      LocalScope inner(*this, scope);
      mark_missing(inner.get(), s.undefined_at_entry[0]);
      for (size_t k = 0; k < s.targets.size(); ++k) assign(s.targets[k], vals[k], inner.get());
      return exec(s.bodies[0], inner.get(), out);
    }
    case SK::Scope: {
      LocalScope inner(*this, scope);
      mark_missing(inner.get(), s.undefined_at_entry[0]);
      return exec(s.bodies[0], inner.get(), out);
    }
    case SK::Break: return Flow::Break;
    case SK::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

std::string Interp::run_loop(const Stmt& s, const ScopePtr& scope, const Value* iterable, int depth0) {
  std::string out;
  exec_for(s, scope, out, iterable, depth0);
  return out;
}

Flow Interp::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out, const Value* iterable, int depth0) {
  Value it = iterable ? *iterable : eval(*s.expr, scope);
  List items = iterate(it);
  if (s.cond) {
    List kept;
    for (auto& item : items) {
      LocalScope tmp(*this, scope);
      assign(s.target, item, tmp.get());
      if (truthy(eval(*s.cond, tmp.get()))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  auto loop = std::make_shared<LoopObj>();
  loop->self = loop;
  loop->stmt = &s;
  loop->outer = scope;
  if (s.recursive) scope->capture();
  loop->depth0 = depth0;
  loop->items = std::make_shared<const List>(std::move(items));
  Value loopv = Value::object(loop);
  const List& xs = *loop->items;
  // jinja2 clears its for-else flag at the *end* of the body, so iterations left through
  // {% continue %} / {% break %} do not count: the else body runs unless one iteration completed.
  bool completed = false;
  for (size_t k = 0; k < xs.size(); ++k) {
    LocalScope iscope(*this, scope);
    mark_missing(iscope.get(), s.undefined_at_entry[0]);
    assign(s.target, xs[k], iscope.get());
    loop->index0 = k;
    iscope.get()->set("loop", loopv);
    Flow f = exec(s.bodies[0], iscope.get(), out);
    if (f == Flow::Break) break;
    if (f == Flow::Normal) completed = true;
    line_ = s.line;
  }
  if (!completed && s.has_else) {
    LocalScope escope(*this, scope);
    mark_missing(escope.get(), s.undefined_at_entry[1]);
    exec(s.bodies[1], escope.get(), out);
  }
  return Flow::Normal;
}

Value Interp::invoke_macro(const MacroObj& m, CallArgs& a) {
  const MacroDef& d = *m.def;
  const size_t n = d.params.size();
  const std::string mname = d.anonymous ? "None" : repr_str(d.name);
  std::vector<std::pair<bool, Value>> arguments(n);
  size_t npos = std::min(n, a.pos.size());
  for (size_t k = 0; k < npos; ++k) arguments[k] = {true, a.pos[k]};
  bool found_caller = false;
  if (npos != n) {
    for (size_t k = npos; k < n; ++k) {
      Value v;
      if (a.take_kw(d.params[k], v)) arguments[k] = {true, std::move(v)};
      if (d.params[k] == "caller") found_caller = true;
    }
  } else {
    for (const auto& p : d.params)
      if (p == "caller") found_caller = true;
  }
  Value caller;
  bool bind_caller = false;
  if (d.uses_caller && !found_caller) {
    bind_caller = true;
    if (!a.take_kw("caller", caller) || caller.is_none()) caller = Value::undefined("No caller defined");
  }
  Value kwargs;
  if (d.uses_kwargs) {
    Dict kd;
    for (auto& kv : a.kw) kd.set(kv.first, kv.second);
    kwargs = Value::make_dict(std::move(kd));
  } else if (!a.kw.empty()) {
    for (const auto& kv : a.kw)
      if (kv.first == "caller")
        py_raise("TypeError", "macro " + mname +
                                  " was invoked with two values for the special caller argument. This is most likely a bug.");
    py_raise("TypeError", "macro " + mname + " takes no keyword argument " + repr_str(a.kw[0].first));
  }
  Value varargs;
  if (d.uses_varargs) {
    List extra;
    for (size_t k = n; k < a.pos.size(); ++k) extra.push_back(a.pos[k]);
    varargs = Value::make_list(std::move(extra), true);
  } else if (a.pos.size() > n) {
    py_raise("TypeError", "macro " + mname + " takes not more than " + std::to_string(n) + " argument(s)");
  }
  if (++depth_ > kMaxMacroDepth) {
    depth_ = 0;
    py_raise("RecursionError", "maximum recursion depth exceeded");
  }
  check_stack();
  LocalScope local(*this, m.closure);
  Scope* scope = local.get();
  mark_missing(scope, d.undefined_at_entry);
  const size_t first_default = n - d.defaults.size();
  for (size_t k = 0; k < n; ++k) {
    if (arguments[k].first) {
      scope->set(d.params[k], arguments[k].second);
    } else if (k >= first_default) {
      scope->set(d.params[k], eval(*d.defaults[k - first_default], scope));
    } else {
      scope->set(d.params[k], Value::undefined("parameter " + repr_str(d.params[k]) + " was not provided"));
    }
  }
  if (bind_caller) scope->set("caller", caller);
  if (d.uses_kwargs) scope->set("kwargs", kwargs);
  if (d.uses_varargs) scope->set("varargs", varargs);
  std::string out;
  int saved_line = line_;
  exec(d.body, scope, out);
  line_ = saved_line;
  --depth_;
  return Value::string(std::move(out));
}

Value Interp::call_value(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (fn.is_object() && fn.obj->callable()) return fn.obj->call(*this, args);
  py_raise("TypeError", "'" + type_name(fn) + "' object is not callable");
}

Value Interp::call_filter(const std::string& name, const Value& v, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) py_raise("TemplateRuntimeError", "No filter named " + repr_str(name) + ".");
  return f(*this, v, args);
}

bool Interp::call_test(const std::string& name, const Value& v, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) py_raise("TemplateRuntimeError", "No test named " + repr_str(name) + ".");
  return t(*this, v, args);
}

void Interp::eval_args(const CallSpec& c, const ScopePtr& scope, CallArgs& out) {
  for (const auto& a : c.args) out.pos.push_back(eval(*a, scope));
  for (const auto& kv : c.kwargs) out.kw.emplace_back(kv.first, eval(*kv.second, scope));
  if (c.dyn_args) {
    Value d = eval(*c.dyn_args, scope);
    for (auto& x : iterate(d)) out.pos.push_back(std::move(x));
  }
  if (c.dyn_kwargs) {
    Value d = eval(*c.dyn_kwargs, scope);
    if (!d.is_dict()) py_raise("TypeError", "argument after ** must be a mapping, not " + type_name(d));
    for (const auto& kv : d.dict->items) out.kw.emplace_back(kv.first, kv.second);
  }
}

Value Interp::eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
  Value fn = eval(*e.kids[0], scope);
  CallArgs args;
  eval_args(e.call, scope, args);
  if (caller) args.kw.emplace_back("caller", *caller);
  line_ = e.line;
  return call_value(fn, args);
}

Value Interp::apply_filter_chain(const Expr& e, const ScopePtr& scope, const Value& input) {
  const Value* saved = filter_input_;
  filter_input_ = &input;
  Value r;
  try {
    r = eval(e, scope);
  } catch (...) {
    filter_input_ = saved;
    throw;
  }
  filter_input_ = saved;
  return r;
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  switch (obj.type) {
    case Type::Undefined: fail_undefined(obj);
    case Type::Object: {
      Value out;
      if (obj.obj->get_attr(name, out)) return out;
      return undefined_attr(obj, name);
    }
    case Type::Dict:
    case Type::String:
    case Type::List:
      if (is_unsafe_method_of(obj, name))
        return Value::undefined("access to attribute " + repr_str(name) + " of " + repr_str(type_name(obj)) +
                                " object is unsafe.");
      if (is_method_of(obj, name)) {
        auto m = std::make_shared<BoundMethod>();
        m->self = obj;
        m->name = name;
        return Value::object(std::move(m));
      }
      if (obj.is_dict()) {
        if (const Value* v = obj.dict->find(name)) return *v;
      }
      return undefined_attr(obj, name);
    case Type::Bool:
    case Type::Int:
      if (name == "real" || name == "numerator") return Value::integer(obj.as_int());
      if (name == "imag") return Value::integer(0);
      if (name == "denominator") return Value::integer(1);
      return undefined_attr(obj, name);
    case Type::Float:
      if (name == "real") return obj;
      if (name == "imag") return Value::number(0.0);
      if (name == "is_integer") {
        auto m = std::make_shared<BoundMethod>();
        m->self = obj;
        m->name = name;
        return Value::object(std::move(m));
      }
      return undefined_attr(obj, name);
    default: return undefined_attr(obj, name);
  }
}

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.type) {
    case Type::Undefined: fail_undefined(obj);
    case Type::Dict:
      if (key.is_string()) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        return getattr(obj, key.s);
      }
      return undefined_item(obj, key);
    case Type::List:
    case Type::String: {
      if (key.is_intlike()) {
        int64_t idx = key.as_int();
        if (obj.is_seq()) {
          int64_t n = static_cast<int64_t>(obj.list->size());
          if (idx < 0) idx += n;
          if (idx < 0 || idx >= n) return undefined_item(obj, key);
          return (*obj.list)[static_cast<size_t>(idx)];
        }
        if (uni::is_ascii(obj.s)) {
          int64_t n = static_cast<int64_t>(obj.s.size());
          if (idx < 0) idx += n;
          if (idx < 0 || idx >= n) return undefined_item(obj, key);
          return Value::string(std::string(1, obj.s[static_cast<size_t>(idx)]), obj.flag);
        }
        std::u32string cps = uni::decode(obj.s);
        int64_t n = static_cast<int64_t>(cps.size());
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n) return undefined_item(obj, key);
        std::string ch;
        uni::append_utf8(ch, cps[static_cast<size_t>(idx)]);
        return Value::string(std::move(ch), obj.flag);
      }
      if (key.is_string()) return getattr(obj, key.s);
      return undefined_item(obj, key);
    }
    case Type::Object:
      if (key.is_string()) return getattr(obj, key.s);
      return undefined_item(obj, key);
    default:
      if (key.is_string()) return undefined_attr(obj, key.s);
      return undefined_item(obj, key);
  }
}

Value Interp::eval(const Expr& e, const ScopePtr& scope) {
  line_ = e.line;
  check_stack();
  switch (e.kind) {
    case EK::Const: return e.value;
    case EK::Name: return lookup(e.name, scope);
    case EK::List:
    case EK::Tuple: {
      List items;
      items.reserve(e.kids.size());
      for (const auto& k : e.kids) items.push_back(eval(*k, scope));
      return Value::make_list(std::move(items), e.kind == EK::Tuple);
    }
    case EK::Dict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
        Value key = eval(*e.kids[k], scope);
        if (!key.is_string())
          throw TemplateError(TemplateError::Kind::Runtime,
                              "unsupported construct: dict literal with a non-string key (" + repr(key) + ")",
                              e.kids[k]->line, e.kids[k]->col);
        d.set(key.s, eval(*e.kids[k + 1], scope));
      }
      return Value::make_dict(std::move(d));
    }
    case EK::GetAttr: {
      Value obj = eval(*e.kids[0], scope);
      line_ = e.line;
      return getattr(obj, e.name);
    }
    case EK::GetItem: {
      Value obj = eval(*e.kids[0], scope);
      const Expr& k = *e.kids[1];
      if (k.kind == EK::Slice) {
        Value parts[3];
        for (int j = 0; j < 3; ++j) parts[j] = k.kids[j] ? eval(*k.kids[j], scope) : Value::none();
        line_ = e.line;
        try {
          return slice_value(obj, parts[0], parts[1], parts[2]);
        } catch (const PyError& err) {
          if (err.type == "TypeError") return Value::undefined(object_type_repr(obj) + " has no element slice");
          throw;
        }
      }
      Value key = eval(k, scope);
      line_ = e.line;
      return getitem(obj, key);
    }
    case EK::Slice: py_raise("TypeError", "slice outside of a subscript");
    case EK::Call: return eval_call(e, scope, nullptr);
    case EK::Filter: {
      Value v;
      if (e.kids[0])
        v = eval(*e.kids[0], scope);
      else if (filter_input_)
        v = *filter_input_;
      CallArgs args;
      eval_args(e.call, scope, args);
      line_ = e.line;
      return e.filter(*this, v, args);
    }
    case EK::Test: {
      Value v = eval(*e.kids[0], scope);
      CallArgs args;
      eval_args(e.call, scope, args);
      line_ = e.line;
      return Value::boolean(e.test(*this, v, args));
    }
    case EK::Not: return Value::boolean(!truthy(eval(*e.kids[0], scope)));
    case EK::Neg:
    case EK::Pos: {
      Value v = eval(*e.kids[0], scope);
      if (v.is_undefined()) fail_undefined(v);
      bool neg = e.kind == EK::Neg;
      if (v.is_intlike()) {
        if (neg && v.as_int() == INT64_MIN) py_raise("OverflowError", "integer overflow");
        return Value::integer(neg ? -v.as_int() : v.as_int());
      }
      if (v.is_float()) return Value::number(neg ? -v.f : v.f);
      py_raise("TypeError", std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + type_name(v) + "'");
    }
    case EK::Binary: {
      Value a = eval(*e.kids[0], scope);
      Value b = eval(*e.kids[1], scope);
      line_ = e.line;
      if (e.name == "**" && e.kids[0]->pure && !e.kids[1]->pure && a.is_number() &&
          (a.is_float() ? std::signbit(a.f) : a.as_int() < 0)) {
        // jinja2 constant-folds the base and emits it unparenthesised ("(-2 ** x)"), which Python
        // reads as -(2 ** x). Reproduce that.
        Value pos = a.is_float() ? Value::number(-a.f) : Value::integer(-a.as_int());
        Value r = binop("**", pos, b);
        return r.is_float() ? Value::number(-r.f) : Value::integer(-r.as_int());
      }
      return binop(e.name, a, b);
    }
    case EK::Compare: {
      Value left = eval(*e.kids[0], scope);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.kids[k + 1], scope);
        const std::string& op = e.ops[k];
        bool r;
        if (op == "==") r = equals(left, right);
        else if (op == "!=") r = !equals(left, right);
        else if (op == "in") r = contains(right, left);
        else if (op == "notin") r = !contains(right, left);
        else r = less(left, right, op.c_str());
        if (!r) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case EK::And: {
      Value l = eval(*e.kids[0], scope);
      if (!truthy(l)) return l;
      return eval(*e.kids[1], scope);
    }
    case EK::Or: {
      Value l = eval(*e.kids[0], scope);
      if (truthy(l)) return l;
      return eval(*e.kids[1], scope);
    }
    case EK::Concat: {
      std::string s;
      for (const auto& k : e.kids) {
        Value v = eval(*k, scope);
        if (v.is_string())
          s += v.s;
        else
          s += to_str(v);
      }
      return Value::string(std::move(s));
    }
    case EK::CondExpr: {
      if (truthy(eval(*e.kids[0], scope))) return eval(*e.kids[1], scope);
      if (e.kids[2]) return eval(*e.kids[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

}  // namespace bonsai::tpl
