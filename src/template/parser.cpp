// Recursive-descent parser mirroring jinja2's grammar (precedence, tuples, tests, filters, slices).
#include <map>
#include <set>

#include "template/ast.h"
#include "template/chat_template.h"

namespace bonsai::tpl {

namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Name:
    case Tok::Op: return t.text;
    case Tok::Data: return "template data / text";
    case Tok::VarBegin: return "begin of print statement";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockBegin: return "begin of statement block";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::String: return "string";
    case Tok::Integer: return "integer";
    case Tok::Float: return "float";
    case Tok::Eof: return "end of template";
  }
  return "token";
}

const std::set<std::string>& end_tags() {
  static const std::set<std::string> s = {"endfor",  "endif",     "endmacro",      "endset",  "endcall",
                                          "endfilter", "endwith", "endgeneration", "else",    "elif",
                                          "endraw",  "endblock",  "endautoescape", "endtrans"};
  return s;
}

const std::set<std::string>& unsupported_tags() {
  static const std::set<std::string> s = {"block", "extends", "include", "import", "from",     "autoescape",
                                          "do",    "trans",   "pluralize", "debug", "endtrans"};
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    prog->body = subparse({});
    if (cur().type != Tok::Eof) fail_here("unexpected " + repr_str(describe(cur())));
    mark_pure(prog->body);
    analyze_frames(*prog);
    return prog;
  }

 private:
  struct Open {
    std::string tag;
    int line;
  };
  std::vector<Token> t_;
  size_t i_ = 0;
  std::vector<Open> open_;
  int loop_depth_ = 0;
  int nesting_ = 0;  // recursion guard: expressions / blocks nested deeper than kMaxNesting fail

  static constexpr int kMaxNesting = 400;
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxNesting) p.fail_here("template nested too deeply");
    }
    ~Nest() { --p.nesting_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* o) const { return cur().type == Tok::Op && cur().text == o; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* o) {
    if (!is_op(o)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(const Token& at, std::string msg) {
    throw TemplateError(TemplateError::Kind::Syntax, std::move(msg), at.line, at.col);
  }
  [[noreturn]] void fail_here(std::string msg) { fail(cur(), std::move(msg)); }

  void expect_op(const char* o) {
    if (!is_op(o)) fail_here(std::string("expected '") + o + "', got " + repr_str(describe(cur())));
    next();
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail_here(std::string("expected ") + what + ", got " + repr_str(describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail_here("expected name, got " + repr_str(describe(cur())));
    return next().text;
  }

  [[noreturn]] void fail_eof(const std::vector<std::string>& ends) {
    std::string want;
    for (size_t k = 0; k < ends.size(); ++k) {
      if (k) want += k + 1 == ends.size() ? " or " : ", ";
      want += "'" + ends[k] + "'";
    }
    std::string msg = "unexpected end of template";
    if (!open_.empty())
      msg += ": unterminated '{% " + open_.back().tag + " %}' block opened at line " +
             std::to_string(open_.back().line);
    if (!want.empty()) msg += " (expected " + want + ")";
    fail(cur(), msg);
  }

  // ---- statements -------------------------------------------------------------------------

  Body subparse(const std::vector<std::string>& ends) {
    Nest guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.type) {
        case Tok::Data: {
          auto s = std::make_unique<Stmt>(SK::Text, t.line, t.col);
          s->text = t.text;
          body.push_back(std::move(s));
          next();
          break;
        }
        case Tok::VarBegin: {
          auto s = std::make_unique<Stmt>(SK::Output, t.line, t.col);
          next();
          s->exprs.push_back(parse_tuple(false, true, {}, false, false));
          expect(Tok::VarEnd, "end of print statement");
          body.push_back(std::move(s));
          break;
        }
        case Tok::BlockBegin: {
          next();
          if (cur().type == Tok::Name) {
            for (const auto& e : ends)
              if (cur().text == e) return body;
          }
          StmtPtr s = parse_statement();
          if (s) body.push_back(std::move(s));
          expect(Tok::BlockEnd, "end of statement block");
          break;
        }
        case Tok::Eof: return body;
        default: fail_here("unexpected " + repr_str(describe(t)));
      }
    }
  }

  Body parse_statements(const std::vector<std::string>& ends, bool drop_needle) {
    skip_op(":");
    expect(Tok::BlockEnd, "end of statement block");
    Body body = subparse(ends);
    if (cur().type == Tok::Eof) fail_eof(ends);
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    if (t.type != Tok::Name) fail_here("tag name expected");
    std::string name = t.text;
    int line = t.line;
    if (name == "for" || name == "if" || name == "set" || name == "macro" || name == "call" ||
        name == "filter" || name == "with" || name == "generation") {
      open_.push_back({name, line});
      StmtPtr s;
      if (name == "for") s = parse_for();
      else if (name == "if") s = parse_if();
      else if (name == "set") s = parse_set();
      else if (name == "macro") s = parse_macro();
      else if (name == "call") s = parse_call_block();
      else if (name == "filter") s = parse_filter_block();
      else if (name == "with") s = parse_with();
      else s = parse_generation();
      open_.pop_back();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_here("'" + name + "' outside loop");
      const Token& k = next();
      return std::make_unique<Stmt>(name == "break" ? SK::Break : SK::Continue, k.line, k.col);
    }
    if (name == "print") {
      const Token& k = next();
      auto s = std::make_unique<Stmt>(SK::Output, k.line, k.col);
      while (cur().type != Tok::BlockEnd) {
        if (!s->exprs.empty()) expect_op(",");
        s->exprs.push_back(parse_expression(true));
      }
      return s;
    }
    if (end_tags().count(name)) {
      std::string msg = "unexpected '{% " + name + " %}'";
      if (!open_.empty())
        msg += " (the innermost open block is '{% " + open_.back().tag + " %}' from line " +
               std::to_string(open_.back().line) + ")";
      else
        msg += " (no open block to close)";
      fail_here(msg);
    }
    if (unsupported_tags().count(name)) fail_here("unsupported construct '{% " + name + " %}'");
    fail_here("unknown tag '" + name + "'");
  }

  StmtPtr parse_for() {
    const Token& k = next();
    auto s = std::make_unique<Stmt>(SK::For, k.line, k.col);
    s->target = parse_assign_target(true, false, {"in"}, false);
    if (!skip_name("in")) fail_here("expected 'in', got " + repr_str(describe(cur())));
    s->expr = parse_tuple(false, false, {"recursive"}, false, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    Body body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    s->bodies.push_back(std::move(body));
    if (next().text == "endfor") {
      s->bodies.emplace_back();
    } else {
      s->has_else = true;
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->bodies.push_back(parse_statements({"endfor"}, true));
      loop_depth_ = saved;
    }
    return s;
  }

  StmtPtr parse_if() {
    const Token& k = next();
    auto s = std::make_unique<Stmt>(SK::If, k.line, k.col);
    while (true) {
      s->exprs.push_back(parse_tuple(false, false, {}, false, false));
      s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") {
        s->has_else = true;
        s->bodies.push_back(parse_statements({"endif"}, true));
      }
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    const Token& k = next();
    int line = k.line, col = k.col;
    Target target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto s = std::make_unique<Stmt>(SK::Set, line, col);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false, false);
      return s;
    }
    auto s = std::make_unique<Stmt>(SK::SetBlock, line, col);
    s->target = std::move(target);
    if (is_op("|")) s->expr = parse_filter(nullptr, false);
    s->bodies.push_back(parse_statements({"endset"}, true));
    return s;
  }

  void parse_signature(MacroDef& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      if (cur().type != Tok::Name) fail_here("expected parameter name, got " + repr_str(describe(cur())));
      m.params.push_back(next().text);
      if (skip_op("=")) {
        m.defaults.push_back(parse_expression(true));
      } else if (!m.defaults.empty()) {
        fail_here("non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  static void collect_names(const Expr* e, std::set<std::string>& out) {
    if (!e) return;
    if (e->kind == EK::Name) out.insert(e->name);
    for (const auto& k : e->kids) collect_names(k.get(), out);
    for (const auto& a : e->call.args) collect_names(a.get(), out);
    for (const auto& kv : e->call.kwargs) collect_names(kv.second.get(), out);
    collect_names(e->call.dyn_args.get(), out);
    collect_names(e->call.dyn_kwargs.get(), out);
  }
  static void collect_names(const Body& body, std::set<std::string>& out) {
    for (const auto& s : body) {
      for (const auto& e : s->exprs) collect_names(e.get(), out);
      for (const auto& b : s->bodies) collect_names(b, out);
      collect_names(s->expr.get(), out);
      collect_names(s->cond.get(), out);
      if (s->macro) {
        for (const auto& d : s->macro->defaults) collect_names(d.get(), out);
        collect_names(s->macro->body, out);
      }
    }
  }
  // ---- jinja2's per-frame symbol analysis (idtracking), for undefined_at_entry -------------

  enum class Load { Param, Resolve, Alias, Undefined };
  struct Sym {
    const Sym* parent = nullptr;
    std::map<std::string, Load> refs;
    std::set<std::string> stores;
    bool find(const std::string& n) const {
      for (const Sym* s = this; s; s = s->parent)
        if (s->refs.count(n)) return true;
      return false;
    }
    void load(const std::string& n) {
      if (!find(n)) refs[n] = Load::Resolve;
    }
    void store(const std::string& n) {
      stores.insert(n);
      if (refs.count(n)) return;
      refs[n] = (parent && parent->find(n)) ? Load::Alias : Load::Undefined;
    }
    void param(const std::string& n) {
      stores.insert(n);
      refs[n] = Load::Param;
    }
    void branch_update(const std::vector<Sym>& branches) {
      std::set<std::string> new_stores;
      for (const auto& b : branches)
        for (const auto& n : b.stores)
          if (!stores.count(n)) new_stores.insert(n);
      for (const auto& b : branches) {
        for (const auto& kv : b.refs) refs[kv.first] = kv.second;
        stores.insert(b.stores.begin(), b.stores.end());
      }
      for (const auto& n : new_stores) refs[n] = (parent && parent->find(n)) ? Load::Alias : Load::Resolve;
    }
    std::vector<std::string> undefined_names() const {
      std::vector<std::string> out;
      for (const auto& kv : refs)
        if (kv.second == Load::Undefined) out.push_back(kv.first);
      return out;
    }
  };

  static void sym_expr(const Expr* e, Sym& sym) {
    if (!e) return;
    if (e->kind == EK::Name) sym.load(e->name);
    for (const auto& k : e->kids) sym_expr(k.get(), sym);
    for (const auto& a : e->call.args) sym_expr(a.get(), sym);
    for (const auto& kv : e->call.kwargs) sym_expr(kv.second.get(), sym);
    sym_expr(e->call.dyn_args.get(), sym);
    sym_expr(e->call.dyn_kwargs.get(), sym);
  }
  static void sym_target(const Target& t, Sym& sym, bool as_param) {
    switch (t.kind) {
      case Target::Name:
        if (as_param)
          sym.param(t.name);
        else
          sym.store(t.name);
        break;
      case Target::Tuple:
        for (const auto& i : t.items) sym_target(i, sym, as_param);
        break;
      case Target::NSRef: sym.load(t.name); break;
    }
  }
  // FrameSymbolVisitor: the statements of one frame, stopping at nested frames.
  static void sym_stmts(const Body& body, Sym& sym) {
    for (const auto& s : body) sym_stmt(*s, sym);
  }
  static void sym_if(const Stmt& s, size_t branch, Sym& sym) {
    // jinja2's If(test, body, elif_=[If...], else_): branches are analysed on copies, then merged.
    sym_expr(s.exprs[branch].get(), sym);
    std::vector<Sym> branches(3, sym);
    sym_stmts(s.bodies[branch], branches[0]);
    if (branch == 0)
      for (size_t k = 1; k < s.exprs.size(); ++k) sym_if(s, k, branches[1]);
    if (branch == 0 && s.has_else) sym_stmts(s.bodies.back(), branches[2]);
    sym.branch_update(branches);
  }
  static void sym_stmt(const Stmt& s, Sym& sym) {
    switch (s.kind) {
      case SK::Output:
      case SK::With:
        for (const auto& e : s.exprs) sym_expr(e.get(), sym);
        break;
      case SK::If: sym_if(s, 0, sym); break;
      case SK::For: sym_expr(s.expr.get(), sym); break;
      case SK::Set:
        sym_expr(s.expr.get(), sym);
        sym_target(s.target, sym, false);
        break;
      case SK::SetBlock: sym_target(s.target, sym, false); break;
      case SK::Macro: sym.store(s.macro->name); break;
      case SK::CallBlock:
      case SK::FilterBlock: sym_expr(s.expr.get(), sym); break;
      default: break;
    }
  }
  // RootVisitor: analyse the child frames opened by the statements of a frame (incl. inside ifs).
  static void child_frames(Body& body, const Sym& parent) {
    for (auto& s : body) {
      switch (s->kind) {
        case SK::If:
          for (auto& b : s->bodies) child_frames(b, parent);
          break;
        case SK::For: {
          s->undefined_at_entry.assign(2, {});
          Sym f;
          f.parent = &parent;
          sym_target(s->target, f, true);
          f.param("loop");
          sym_stmts(s->bodies[0], f);
          s->undefined_at_entry[0] = f.undefined_names();
          child_frames(s->bodies[0], f);
          Sym e;
          e.parent = &parent;
          sym_stmts(s->bodies[1], e);
          s->undefined_at_entry[1] = e.undefined_names();
          child_frames(s->bodies[1], e);
          break;
        }
        case SK::Macro:
        case SK::CallBlock: {
          MacroDef& m = *s->macro;
          Sym f;
          f.parent = &parent;
          for (const auto& p : m.params) f.param(p);
          for (const auto& d : m.defaults) sym_expr(d.get(), f);
          if (m.uses_caller) f.param("caller");
          if (m.uses_kwargs) f.param("kwargs");
          if (m.uses_varargs) f.param("varargs");
          sym_stmts(m.body, f);
          m.undefined_at_entry = f.undefined_names();
          child_frames(m.body, f);
          break;
        }
        case SK::With:
        case SK::SetBlock:
        case SK::FilterBlock:
        case SK::Scope: {
          Sym f;
          f.parent = &parent;
          for (const auto& t : s->targets) sym_target(t, f, true);
          sym_stmts(s->bodies[0], f);
          s->undefined_at_entry.assign(1, f.undefined_names());
          child_frames(s->bodies[0], f);
          break;
        }
        default: break;
      }
    }
  }
  static void analyze_frames(Program& prog) {
    Sym root;
    sym_stmts(prog.body, root);
    prog.undefined_at_entry = root.undefined_names();
    child_frames(prog.body, root);
  }

  // Which expressions jinja2's optimizer folds to constants (nodes.*.as_const succeeds).
  static bool mark_pure(Expr* e) {
    if (!e) return true;
    bool all = true;
    for (auto& k : e->kids) all = mark_pure(k.get()) && all;
    for (auto& a : e->call.args) all = mark_pure(a.get()) && all;
    for (auto& kv : e->call.kwargs) all = mark_pure(kv.second.get()) && all;
    all = mark_pure(e->call.dyn_args.get()) && all;
    all = mark_pure(e->call.dyn_kwargs.get()) && all;
    switch (e->kind) {
      case EK::Name:
      case EK::Call: e->pure = false; break;
      case EK::Filter:
        e->pure = all && e->kids[0] && e->name != "map" && e->name != "select" && e->name != "reject" &&
                  e->name != "selectattr" && e->name != "rejectattr";
        break;
      case EK::CondExpr: e->pure = all && e->kids[2]; break;
      default: e->pure = all;
    }
    return e->pure;
  }
  static void mark_pure(Body& body) {
    for (auto& s : body) {
      for (auto& e : s->exprs) mark_pure(e.get());
      for (auto& b : s->bodies) mark_pure(b);
      mark_pure(s->expr.get());
      mark_pure(s->cond.get());
      if (s->macro) {
        for (auto& d : s->macro->defaults) mark_pure(d.get());
        mark_pure(s->macro->body);
      }
    }
  }

  static void mark_special(MacroDef& m) {
    std::set<std::string> names;
    collect_names(m.body, names);
    for (const auto& d : m.defaults) collect_names(d.get(), names);
    m.uses_caller = names.count("caller") > 0;
    m.uses_kwargs = names.count("kwargs") > 0;
    m.uses_varargs = names.count("varargs") > 0;
  }

  StmtPtr parse_macro() {
    const Token& k = next();
    auto s = std::make_unique<Stmt>(SK::Macro, k.line, k.col);
    auto m = std::make_shared<MacroDef>();
    m->line = k.line;
    m->name = expect_name();
    parse_signature(*m);
    int saved = loop_depth_;
    loop_depth_ = 0;
    m->body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved;
    mark_special(*m);
    s->macro = std::move(m);
    return s;
  }

  StmtPtr parse_call_block() {
    const Token& k = next();
    auto s = std::make_unique<Stmt>(SK::CallBlock, k.line, k.col);
    auto m = std::make_shared<MacroDef>();
    m->line = k.line;
    m->name = "caller";
    m->anonymous = true;
    if (is_op("(")) parse_signature(*m);
    const Token& at = cur();
    s->expr = parse_expression(true);
    if (s->expr->kind != EK::Call) fail(at, "expected call");
    int saved = loop_depth_;
    loop_depth_ = 0;
    m->body = parse_statements({"endcall"}, true);
    loop_depth_ = saved;
    mark_special(*m);
    s->macro = std::move(m);
    return s;
  }

  StmtPtr parse_filter_block() {
    const Token& k = next();
    auto s = std::make_unique<Stmt>(SK::FilterBlock, k.line, k.col);
    s->expr = parse_filter(nullptr, true);
    s->bodies.push_back(parse_statements({"endfilter"}, true));
    return s;
  }

  StmtPtr parse_with() {
    const Token& k = next();
    auto s = std::make_unique<Stmt>(SK::With, k.line, k.col);
    while (cur().type != Tok::BlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target(true, false, {}, false));
      expect_op("=");
      s->exprs.push_back(parse_expression(true));
    }
    s->bodies.push_back(parse_statements({"endwith"}, true));
    return s;
  }

  StmtPtr parse_generation() {
    const Token& k = next();
    auto s = std::make_unique<Stmt>(SK::Scope, k.line, k.col);
    s->bodies.push_back(parse_statements({"endgeneration"}, true));
    return s;
  }

  Target to_target(const Expr& e) {
    Target t;
    if (e.kind == EK::Name) {
      t.kind = Target::Name;
      t.name = e.name;
      return t;
    }
    if (e.kind == EK::Tuple) {
      t.kind = Target::Tuple;
      for (const auto& k : e.kids) t.items.push_back(to_target(*k));
      return t;
    }
    if (e.kind == EK::GetAttr && e.value.is_bool()) {  // namespace reference
      t.kind = Target::NSRef;
      t.name = e.kids[0]->name;
      t.attr = e.name;
      return t;
    }
    static const char* names[] = {"const",  "name",   "list",    "tuple", "dict", "getattr", "getitem",
                                  "slice",  "call",   "filter",  "test",  "not",  "neg",     "pos",
                                  "binary", "compare", "and",    "or",    "concat", "condexpr"};
    throw TemplateError(TemplateError::Kind::Syntax,
                        std::string("can't assign to '") + names[static_cast<int>(e.kind)] + "'", e.line, e.col);
  }

  Target parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end,
                             bool with_namespace) {
    if (name_only) {
      Target t;
      t.name = expect_name();
      return t;
    }
    ExprPtr e = with_tuple ? parse_tuple(true, true, extra_end, false, with_namespace)
                           : parse_primary(with_namespace);
    return to_target(*e);
  }

  // ---- expressions ------------------------------------------------------------------------

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")")) return true;
    if (cur().type == Tok::Name)
      for (const auto& e : extra_end)
        if (cur().text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parens, bool with_namespace) {
    int line = cur().line, col = cur().col;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail_here("Expected an expression, got " + repr_str(describe(cur())));
    }
    auto t = std::make_unique<Expr>(EK::Tuple, line, col);
    t->kids = std::move(args);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    int line = cur().line, col = cur().col;
    ExprPtr e1 = parse_or();
    while (skip_name("if")) {
      ExprPtr e2 = parse_or();
      ExprPtr e3;
      if (skip_name("else")) e3 = parse_condexpr();
      auto c = std::make_unique<Expr>(EK::CondExpr, line, col);
      c->kids.push_back(std::move(e2));
      c->kids.push_back(std::move(e1));
      c->kids.push_back(std::move(e3));
      e1 = std::move(c);
    }
    return e1;
  }

  ExprPtr binary(EK kind, ExprPtr a, ExprPtr b, const std::string& op = "") {
    auto e = std::make_unique<Expr>(kind, a->line, a->col);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (skip_name("or")) l = binary(EK::Or, std::move(l), parse_and());
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (skip_name("and")) l = binary(EK::And, std::move(l), parse_not());
    return l;
  }

  ExprPtr parse_not() {
    Nest guard(*this);
    if (is_name("not")) {
      const Token& k = next();
      auto e = std::make_unique<Expr>(EK::Not, k.line, k.col);
      e->kids.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line, col = cur().col;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        ops.push_back(next().text);
        operands.push_back(parse_math1());
      } else if (skip_name("in")) {
        ops.push_back("in");
        operands.push_back(parse_math1());
      } else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
        next();
        next();
        ops.push_back("notin");
        operands.push_back(parse_math1());
      } else {
        break;
      }
    }
    if (ops.empty()) return first;
    auto e = std::make_unique<Expr>(EK::Compare, line, col);
    e->kids.push_back(std::move(first));
    for (auto& o : operands) e->kids.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      l = binary(EK::Binary, std::move(l), parse_concat(), op);
    }
    return l;
  }

  ExprPtr parse_concat() {
    int line = cur().line, col = cur().col;
    std::vector<ExprPtr> args;
    args.push_back(parse_math2());
    while (skip_op("~")) args.push_back(parse_math2());
    if (args.size() == 1) return std::move(args[0]);
    auto e = std::make_unique<Expr>(EK::Concat, line, col);
    e->kids = std::move(args);
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      l = binary(EK::Binary, std::move(l), parse_pow(), op);
    }
    return l;
  }

  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (skip_op("**")) l = binary(EK::Binary, std::move(l), parse_unary(true), "**");
    return l;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& k = next();
      node = std::make_unique<Expr>(k.text == "-" ? EK::Neg : EK::Pos, k.line, k.col);
      node->kids.push_back(parse_unary(false));
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    const Token& t = cur();
    int line = t.line, col = t.col;
    switch (t.type) {
      case Tok::Name: {
        std::string name = next().text;
        auto e = std::make_unique<Expr>(EK::Const, line, col);
        if (name == "true" || name == "True" || name == "false" || name == "False") {
          e->value = Value::boolean(name == "true" || name == "True");
          return e;
        }
        if (name == "none" || name == "None") {
          e->value = Value::none();
          return e;
        }
        if (with_namespace && is_op(".")) {
          next();
          auto base = std::make_unique<Expr>(EK::Name, line, col);
          base->name = name;
          auto r = std::make_unique<Expr>(EK::GetAttr, line, col);
          r->name = expect_name();
          r->value = Value::boolean(true);  // marks a namespace reference
          r->kids.push_back(std::move(base));
          return r;
        }
        e->kind = EK::Name;
        e->name = name;
        return e;
      }
      case Tok::String: {
        std::string s = next().text;
        while (cur().type == Tok::String) s += next().text;
        auto e = std::make_unique<Expr>(EK::Const, line, col);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::Integer:
      case Tok::Float: {
        auto e = std::make_unique<Expr>(EK::Const, line, col);
        e->value = next().num;
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true, false);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail_here("unexpected " + repr_str(describe(t)));
  }

  ExprPtr parse_list() {
    const Token& k = next();
    auto e = std::make_unique<Expr>(EK::List, k.line, k.col);
    while (!is_op("]")) {
      if (!e->kids.empty()) expect_op(",");
      if (is_op("]")) break;
      e->kids.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    const Token& k = next();
    auto e = std::make_unique<Expr>(EK::Dict, k.line, k.col);
    while (!is_op("}")) {
      if (!e->kids.empty()) expect_op(",");
      if (is_op("}")) break;
      e->kids.push_back(parse_expression(true));
      expect_op(":");
      e->kids.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& k = next();
    int line = k.line, col = k.col;
    if (k.text == ".") {
      const Token& a = next();
      if (a.type == Tok::Name) {
        auto e = std::make_unique<Expr>(EK::GetAttr, line, col);
        e->name = a.text;
        e->kids.push_back(std::move(node));
        return e;
      }
      if (a.type != Tok::Integer) fail(a, "expected name or number");
      auto c = std::make_unique<Expr>(EK::Const, a.line, a.col);
      c->value = a.num;
      auto e = std::make_unique<Expr>(EK::GetItem, line, col);
      e->kids.push_back(std::move(node));
      e->kids.push_back(std::move(c));
      return e;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = std::make_unique<Expr>(EK::GetItem, line, col);
    e->kids.push_back(std::move(node));
    if (args.size() == 1) {
      e->kids.push_back(std::move(args[0]));
    } else {
      auto t = std::make_unique<Expr>(EK::Tuple, line, col);
      t->kids = std::move(args);
      e->kids.push_back(std::move(t));
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    int line = cur().line, col = cur().col;
    std::vector<ExprPtr> parts;
    if (is_op(":")) {
      next();
      parts.emplace_back();
    } else {
      ExprPtr n = parse_expression(true);
      if (!is_op(":")) return n;
      next();
      parts.push_back(std::move(n));
    }
    if (is_op(":")) {
      parts.emplace_back();
    } else if (!is_op("]") && !is_op(",")) {
      parts.push_back(parse_expression(true));
    } else {
      parts.emplace_back();
    }
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(","))
        parts.push_back(parse_expression(true));
      else
        parts.emplace_back();
    } else {
      parts.emplace_back();
    }
    auto e = std::make_unique<Expr>(EK::Slice, line, col);
    e->kids = std::move(parts);
    return e;
  }

  CallSpec parse_call_args() {
    const Token& open = cur();
    int line = open.line, col = open.col;
    expect_op("(");
    CallSpec c;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok)
        throw TemplateError(TemplateError::Kind::Syntax, "invalid syntax for function call expression", line, col);
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!c.dyn_args && !c.dyn_kwargs);
        next();
        c.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!c.dyn_kwargs);
        next();
        c.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
        ensure(!c.dyn_kwargs);
        std::string key = next().text;
        next();
        c.kwargs.emplace_back(key, parse_expression(true));
      } else {
        ensure(!c.dyn_args && !c.dyn_kwargs && c.kwargs.empty());
        c.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return c;
  }

  ExprPtr parse_call(ExprPtr node) {
    int line = cur().line, col = cur().col;
    auto e = std::make_unique<Expr>(EK::Call, line, col);
    e->call = parse_call_args();
    e->kids.push_back(std::move(node));
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      const Token& nt = cur();
      int line = nt.line, col = nt.col;
      std::string name = dotted_name();
      auto e = std::make_unique<Expr>(EK::Filter, line, col);
      e->name = name;
      e->filter = find_filter(name);
      if (!e->filter) {
        if (is_unsupported_filter(name))
          throw TemplateError(TemplateError::Kind::Syntax, "filter '" + name + "' is not supported", line, col);
        throw TemplateError(TemplateError::Kind::Syntax, "no filter named '" + name + "'", line, col);
      }
      if (is_op("(")) e->call = parse_call_args();
      e->kids.push_back(std::move(node));
      node = std::move(e);
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const Token& k = next();
    int line = k.line, col = k.col;
    bool negated = skip_name("not");
    const Token& nt = cur();
    std::string name = dotted_name();
    auto e = std::make_unique<Expr>(EK::Test, line, col);
    e->name = name;
    e->test = find_test(name);
    if (!e->test) {
      if (is_unsupported_test(name))
        throw TemplateError(TemplateError::Kind::Syntax, "test '" + name + "' is not supported", nt.line, nt.col);
      throw TemplateError(TemplateError::Kind::Syntax, "no test named '" + name + "'", nt.line, nt.col);
    }
    if (is_op("(")) {
      e->call = parse_call_args();
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Integer ||
                cur().type == Tok::Float || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail_here("You cannot chain multiple tests with is");
      e->call.args.push_back(parse_postfix(parse_primary(false)));
    }
    e->kids.push_back(std::move(node));
    if (!negated) return e;
    auto n = std::make_unique<Expr>(EK::Not, line, col);
    n->kids.push_back(std::move(e));
    return n;
  }
};

}  // namespace

std::unique_ptr<Program> parse(std::string_view source) { return Parser(lex(source)).run(); }

}  // namespace bonsai::tpl
