// Tokens and syntax tree of the jinja2 subset (internal to src/template).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "template/value.h"

namespace bonsai::tpl {

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // data, name, operator, decoded string literal
  Value num;         // integer / float literal
  int line = 1;
  int col = 1;
};

// jinja2's lexer with trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False.
std::vector<Token> lex(std::string_view source);

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

using FilterFn = Value (*)(Interp& in, const Value& v, CallArgs& args);
using TestFn = bool (*)(Interp& in, const Value& v, CallArgs& args);
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// Builtin jinja2 filters/tests this implementation deliberately leaves out (clear error).
bool is_unsupported_filter(std::string_view name);
bool is_unsupported_test(std::string_view name);

enum class EK : uint8_t {
  Const,
  Name,
  List,
  Tuple,
  Dict,
  GetAttr,
  GetItem,
  Slice,
  Call,
  Filter,
  Test,
  Not,
  Neg,
  Pos,
  Binary,
  Compare,
  And,
  Or,
  Concat,
  CondExpr,
};

struct CallSpec {
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args;
  ExprPtr dyn_kwargs;
};

struct Expr {
  EK kind;
  int line = 0;
  int col = 0;
  Value value;                   // Const
  std::string name;              // Name, attribute, filter/test name, binary operator
  std::vector<ExprPtr> kids;     // operands (nullptr allowed: slice parts, filter-block input)
  std::vector<std::string> ops;  // Compare operators
  CallSpec call;                 // Call / Filter / Test arguments
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  bool pure = false;  // jinja2's optimizer would constant-fold it (see the `**` quirk in interp.cpp)
  Expr(EK k, int l, int c) : kind(k), line(l), col(c) {}
};

struct Target {
  enum Kind { Name, Tuple, NSRef } kind = Name;
  std::string name;
  std::string attr;  // NSRef
  std::vector<Target> items;
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
  Body body;
  bool uses_caller = false;
  bool uses_kwargs = false;
  bool uses_varargs = false;
  int line = 0;
  bool anonymous = false;  // the caller of a {% call %} block (jinja2: name None)
  std::vector<std::string> undefined_at_entry;  // see Stmt::undefined_at_entry
};

enum class SK : uint8_t {
  Text,
  Output,
  If,
  For,
  Set,
  SetBlock,
  Macro,
  CallBlock,
  FilterBlock,
  With,
  Break,
  Continue,
  Scope,  // a body rendered in place ({% generation %})
};

struct Stmt {
  SK kind;
  int line = 0;
  int col = 0;
  std::string text;             // Text
  std::vector<ExprPtr> exprs;   // Output expressions; If conditions per branch; With values
  std::vector<Body> bodies;     // If: one per condition, plus else; For: body, else
  Target target;                // Set, SetBlock, For
  std::vector<Target> targets;  // With
  ExprPtr expr;                 // Set value; For iterable; CallBlock call; FilterBlock / SetBlock filter
  ExprPtr cond;                 // For filter
  bool recursive = false;
  bool has_else = false;
  std::shared_ptr<MacroDef> macro;  // Macro; CallBlock caller
  // Per body that runs in its own jinja2 frame (For: body, else; With/SetBlock/FilterBlock/Scope:
  // body): names jinja2's symbol analysis initialises as "missing" when the frame starts (first
  // stored in the frame, unknown to enclosing frames), so they read as undefined there, and in
  // nested frames, until assigned, even when the render context has a value for them.
  std::vector<std::vector<std::string>> undefined_at_entry;
  Stmt(SK k, int l, int c) : kind(k), line(l), col(c) {}
};

struct Program {
  Body body;
  std::vector<std::string> undefined_at_entry;  // root frame (shadows context variables)
};

std::unique_ptr<Program> parse(std::string_view source);

}  // namespace bonsai::tpl
