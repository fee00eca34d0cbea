// Template values with Python/jinja2 semantics: the object model behind the interpreter.
// Internal to src/template (the public API is chat_template.h).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bonsai::tpl {

class Interp;
struct Value;
struct CallArgs;

using List = std::vector<Value>;

// A Python exception raised while rendering; the interpreter adds the template line.
struct PyError {
  std::string type;     // "TypeError", "UndefinedError", ...
  std::string message;  // str(exception) as Python would print it
};
[[noreturn]] void py_raise(std::string type, std::string message);

// Ordered str-keyed dict (Python dicts keep insertion order).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value v);
  size_t size() const { return items.size(); }
};

// Namespaces, macros, functions, bound methods, loop contexts.
struct Object {
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // Python class name
  virtual std::string module() const { return "builtins"; }
  virtual std::string repr() const;
  virtual bool callable() const { return false; }
  virtual Value call(Interp& in, CallArgs& args);
  // Attribute lookup on the object itself (namespace attrs, loop.index, ...).
  virtual bool get_attr(const std::string& name, Value& out) const;
  virtual bool truthy() const { return true; }
};

enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object };

struct Value {
  Type type = Type::Undefined;
  bool flag = false;  // String: Markup (safe); List: tuple
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String payload; Undefined: the message raised when it is used
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Object> obj;

  Value() = default;
  static Value undefined(std::string message) {
    Value v;
    v.s = std::move(message);
    return v;
  }
  static Value none() {
    Value v;
    v.type = Type::None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.type = Type::Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.type = Type::Int;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.type = Type::Float;
    v.f = x;
    return v;
  }
  static Value string(std::string x, bool markup = false) {
    Value v;
    v.type = Type::String;
    v.s = std::move(x);
    v.flag = markup;
    return v;
  }
  static Value make_list(List items, bool tuple = false) {
    Value v;
    v.type = Type::List;
    v.flag = tuple;
    v.list = std::make_shared<const List>(std::move(items));
    return v;
  }
  static Value make_dict(Dict d) {
    Value v;
    v.type = Type::Dict;
    v.dict = std::make_shared<const Dict>(std::move(d));
    return v;
  }
  static Value object(std::shared_ptr<Object> o) {
    Value v;
    v.type = Type::Object;
    v.obj = std::move(o);
    return v;
  }

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_bool() const { return type == Type::Bool; }
  bool is_int() const { return type == Type::Int; }  // not bool
  bool is_float() const { return type == Type::Float; }
  bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
  bool is_intlike() const { return type == Type::Int || type == Type::Bool; }
  bool is_string() const { return type == Type::String; }
  bool is_markup() const { return type == Type::String && flag; }
  bool is_list() const { return type == Type::List && !flag; }
  bool is_tuple() const { return type == Type::List && flag; }
  bool is_seq() const { return type == Type::List; }  // list or tuple
  bool is_dict() const { return type == Type::Dict; }
  bool is_object() const { return type == Type::Object; }
  template <class T>
  T* as() const {
    return type == Type::Object ? dynamic_cast<T*>(obj.get()) : nullptr;
  }

  int64_t as_int() const { return type == Type::Bool ? (b ? 1 : 0) : i; }
  double as_double() const { return type == Type::Float ? f : static_cast<double>(as_int()); }
};

// The lazy iterables jinja2 hands out: generators (map/select/unique/batch/|items ...), reverse
// iterators (|reverse of a list) and dict views (d.items()/keys()/values()). Generators and iterators
// are single-use, unsized and always truthy; views are reusable, sized and truthy when non-empty.
struct IterObj : Object {
  std::string name;   // Python type name: "generator", "list_reverseiterator", "dict_items", ...
  std::string owner;  // generator function name, for repr
  List items;
  size_t pos = 0;     // items before pos were consumed
  bool view = false;
  std::shared_ptr<PyError> error;  // raised when consumed (errors inside a generator are lazy)
  std::string type_name() const override { return name; }
  std::string repr() const override;
  bool truthy() const override { return !view || !items.empty(); }
  List take();  // what iter() would yield now (consumes a generator)
};
Value make_iter(std::string name, List items, std::string owner = "");
Value make_view(std::string name, List items);

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Removes and returns a keyword argument, or nullptr-like false.
  bool take_kw(std::string_view name, Value& out);
};

// Python semantics.
std::string type_name(const Value& v);         // type(v).__name__
std::string object_type_repr(const Value& v);  // jinja2.utils.object_type_repr
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v)
std::string repr(const Value& v);    // repr(v)
std::string repr_str(std::string_view s);
std::string float_repr(double d);
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b, const char* op = "<");  // a < b, TypeError if unordered
[[noreturn]] void fail_undefined(const Value& u);

// The Undefined a failed lookup produces (jinja2's message rules).
Value undefined_attr(const Value& obj, const std::string& name);
Value undefined_item(const Value& obj, const Value& key);

// JSON conversion.
Value from_json(const nlohmann::ordered_json& j);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // one level
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonDumpOptions& opt);

// Iteration as Python's iter(): list items, dict keys, string characters; Undefined -> empty.
List iterate(const Value& v);
// len(); TypeError when unsized.
int64_t py_len(const Value& v);

// Code-point level helpers for strings.
std::string escape_html(std::string_view s);  // markupsafe.escape

}  // namespace bonsai::tpl
