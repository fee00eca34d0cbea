#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "template/unicode.h"

namespace bonsai::tpl {

void py_raise(std::string type, std::string message) { throw PyError{std::move(type), std::move(message)}; }

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Dict::set(std::string key, Value v) {
  if (Value* p = find(key)) {
    *p = std::move(v);
    return;
  }
  items.emplace_back(std::move(key), std::move(v));
}

std::string Object::repr() const {
  std::string m = module();
  return "<" + (m == "builtins" ? "" : m + ".") + type_name() + " object>";
}

Value Object::call(Interp&, CallArgs&) {
  std::string msg = "'";
  msg += type_name();
  msg += "' object is not callable";
  py_raise("TypeError", std::move(msg));
}

bool Object::get_attr(const std::string&, Value&) const { return false; }

std::string IterObj::repr() const {
  if (view) {
    List rest(items.begin(), items.end());
    return name + "(" + tpl::repr(Value::make_list(std::move(rest))) + ")";
  }
  if (name == "generator") return "<generator object " + owner + ">";
  return "<" + name + " object>";
}

List IterObj::take() {
  if (view) return items;
  if (error) {
    PyError e = *error;
    error.reset();
    throw e;
  }
  List out(items.begin() + static_cast<long>(std::min(pos, items.size())), items.end());
  pos = items.size();
  return out;
}

Value make_iter(std::string name, List items, std::string owner) {
  auto it = std::make_shared<IterObj>();
  it->name = std::move(name);
  it->owner = std::move(owner);
  it->items = std::move(items);
  return Value::object(std::move(it));
}

Value make_view(std::string name, List items) {
  auto it = std::make_shared<IterObj>();
  it->name = std::move(name);
  it->items = std::move(items);
  it->view = true;
  return Value::object(std::move(it));
}

bool CallArgs::take_kw(std::string_view name, Value& out) {
  for (auto it = kw.begin(); it != kw.end(); ++it) {
    if (it->first == name) {
      out = std::move(it->second);
      kw.erase(it);
      return true;
    }
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return v.flag ? "Markup" : "str";
    case Type::List: return v.flag ? "tuple" : "list";
    case Type::Dict: return "dict";
    case Type::Object: return v.obj->type_name();
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.type) {
    case Type::None: return "None";
    case Type::Undefined: return "jinja2.runtime.Undefined object";
    case Type::String:
      if (v.flag) return "markupsafe.Markup object";
      break;
    case Type::Object: {
      std::string m = v.obj->module();
      if (m != "builtins") return m + "." + v.obj->type_name() + " object";
      break;
    }
    default: break;
  }
  return type_name(v) + " object";
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return v.b;
    case Type::Int: return v.i != 0;
    case Type::Float: return v.f != 0.0;
    case Type::String: return !v.s.empty();
    case Type::List: return !v.list->empty();
    case Type::Dict: return v.dict->size() != 0;
    case Type::Object: return v.obj->truthy();
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sv(buf, static_cast<size_t>(res.ptr - buf));
  bool neg = false;
  if (!sv.empty() && sv[0] == '-') {
    neg = true;
    sv.remove_prefix(1);
  }
  size_t epos = sv.find('e');
  std::string digits;
  for (char c : sv.substr(0, epos))
    if (c != '.') digits.push_back(c);
  int exp10 = 0;
  {
    std::string_view es = sv.substr(epos + 1);
    bool eneg = false;
    if (!es.empty() && (es[0] == '+' || es[0] == '-')) {
      eneg = es[0] == '-';
      es.remove_prefix(1);
    }
    std::from_chars(es.data(), es.data() + es.size(), exp10);
    if (eneg) exp10 = -exp10;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;
  int nd = static_cast<int>(digits.size());
  std::string out = neg ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (nd > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    int e = decpt - 1;
    out += 'e';
    out += e < 0 ? '-' : '+';
    int ae = e < 0 ? -e : e;
    if (ae < 10) out += '0';
    out += std::to_string(ae);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= nd) {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out += '.';
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
  return out;
}

std::string repr_str(std::string_view s) {
  bool has_sq = s.find('\'') != std::string_view::npos;
  bool has_dq = s.find('"') != std::string_view::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  std::u32string cps = uni::decode(s);
  char buf[16];
  for (char32_t c : cps) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x7F) {
      out += static_cast<char>(c);
    } else if (!uni::is_printable(c)) {
      if (c < 0x100)
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000)
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      uni::append_utf8(out, c);
    }
  }
  out += q;
  return out;
}

std::string repr(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "None";
    case Type::Bool: return v.b ? "True" : "False";
    case Type::Int: return std::to_string(v.i);
    case Type::Float: return float_repr(v.f);
    case Type::String: return v.flag ? "Markup(" + repr_str(v.s) + ")" : repr_str(v.s);
    case Type::List: {
      std::string out = v.flag ? "(" : "[";
      bool first = true;
      for (const Value& x : *v.list) {
        if (!first) out += ", ";
        first = false;
        out += repr(x);
      }
      if (v.flag && v.list->size() == 1) out += ",";
      out += v.flag ? ")" : "]";
      return out;
    }
    case Type::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_str(kv.first);
        out += ": ";
        out += repr(kv.second);
      }
      out += "}";
      return out;
    }
    case Type::Object: return v.obj->repr();
  }
  return "";
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "";
    case Type::String: return v.s;
    default: return repr(v);
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_intlike() && b.is_intlike()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::None: return true;
    case Type::String: return a.s == b.s;
    case Type::List: {
      if (a.flag != b.flag || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Type::Dict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !equals(kv.second, *o)) return false;
      }
      return true;
    }
    case Type::Object: return a.obj == b.obj;
    default: return false;
  }
}

void fail_undefined(const Value& u) { py_raise("UndefinedError", u.s); }

namespace {
// -1, 0, 1; 2 = unordered (NaN). Throws TypeError for unorderable types.
int cmp3(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_intlike() && b.is_intlike()) {
      int64_t x = a.as_int(), y = b.as_int();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    double x = a.as_double(), y = b.as_double();
    if (std::isnan(x) || std::isnan(y)) return 2;
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.s.compare(b.s);
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.type == Type::List && b.type == Type::List && a.flag == b.flag) {
    const List& x = *a.list;
    const List& y = *b.list;
    size_t n = std::min(x.size(), y.size());
    for (size_t k = 0; k < n; ++k) {
      if (equals(x[k], y[k])) continue;
      return cmp3(x[k], y[k], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  py_raise("TypeError", std::string("'") + op + "' not supported between instances of '" + type_name(a) +
                            "' and '" + type_name(b) + "'");
}
}  // namespace

bool less(const Value& a, const Value& b, const char* op) {
  std::string o = op;
  if (o == "<") return cmp3(a, b, op) == -1;
  if (o == "<=") {
    int c = cmp3(a, b, op);
    return c == -1 || c == 0;
  }
  if (o == ">") return cmp3(a, b, op) == 1;
  if (o == ">=") {
    int c = cmp3(a, b, op);
    return c == 1 || c == 0;
  }
  return cmp3(a, b, op) == -1;
}

Value undefined_attr(const Value& obj, const std::string& name) {
  return Value::undefined(repr_str(object_type_repr(obj)) + " has no attribute " + repr_str(name));
}

Value undefined_item(const Value& obj, const Value& key) {
  if (key.is_string()) return undefined_attr(obj, key.s);
  return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
}

Value from_json(const nlohmann::ordered_json& j) {
  using vt = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case vt::null: return Value::none();
    case vt::boolean: return Value::boolean(j.get<bool>());
    case vt::number_integer: return Value::integer(j.get<int64_t>());
    case vt::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case vt::number_float: return Value::number(j.get<double>());
    case vt::string: return Value::string(j.get<std::string>());
    case vt::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x));
      return Value::make_list(std::move(l));
    }
    case vt::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: py_raise("TypeError", "unsupported JSON value in template context (binary or discarded)");
  }
}

namespace {
void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  char buf[16];
  if (!ensure_ascii) {
    for (char ch : s) {
      unsigned char c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) {
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
          } else {
            out += ch;
          }
      }
    }
  } else {
    for (char32_t c : uni::decode(s)) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c >= 0x20 && c <= 0x7E) {
            out += static_cast<char>(c);
          } else if (c < 0x10000) {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
            out += buf;
          } else {
            char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)),
                          static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
            out += buf;
          }
      }
    }
  }
  out += '"';
}

void json_dump(const Value& v, const JsonDumpOptions& o, int level, std::string& out) {
  switch (v.type) {
    case Type::None: out += "null"; return;
    case Type::Bool: out += v.b ? "true" : "false"; return;
    case Type::Int: out += std::to_string(v.i); return;
    case Type::Float:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += float_repr(v.f);
      return;
    case Type::String: json_string(v.s, o.ensure_ascii, out); return;
    case Type::List:
    case Type::Dict: {
      bool is_list = v.type == Type::List;
      size_t n = is_list ? v.list->size() : v.dict->size();
      if (n == 0) {
        out += is_list ? "[]" : "{}";
        return;
      }
      out += is_list ? '[' : '{';
      std::string newline_indent;
      if (o.has_indent) {
        newline_indent = "\n";
        for (int k = 0; k <= level; ++k) newline_indent += o.indent;
        out += newline_indent;
      }
      std::string sep = o.item_sep + newline_indent;
      if (is_list) {
        bool first = true;
        for (const Value& x : *v.list) {
          if (!first) out += sep;
          first = false;
          json_dump(x, o, level + 1, out);
        }
      } else {
        std::vector<const std::pair<std::string, Value>*> items;
        items.reserve(n);
        for (const auto& kv : v.dict->items) items.push_back(&kv);
        if (o.sort_keys)
          std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
        bool first = true;
        for (auto* kv : items) {
          if (!first) out += sep;
          first = false;
          json_string(kv->first, o.ensure_ascii, out);
          out += o.key_sep;
          json_dump(kv->second, o, level + 1, out);
        }
      }
      if (o.has_indent) {
        out += '\n';
        for (int k = 0; k < level; ++k) out += o.indent;
      }
      out += is_list ? ']' : '}';
      return;
    }
    case Type::Undefined:
    case Type::Object:
      py_raise("TypeError", "Object of type " + type_name(v) + " is not JSON serializable");
  }
}
}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  json_dump(v, opt, 0, out);
  return out;
}

List iterate(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return {};
    case Type::List: return *v.list;
    case Type::Dict: {
      List out;
      out.reserve(v.dict->size());
      for (const auto& kv : v.dict->items) out.push_back(Value::string(kv.first));
      return out;
    }
    case Type::String: {
      List out;
      if (uni::is_ascii(v.s)) {
        out.reserve(v.s.size());
        for (char c : v.s) out.push_back(Value::string(std::string(1, c)));
      } else {
        for (char32_t c : uni::decode(v.s)) {
          std::string s;
          uni::append_utf8(s, c);
          out.push_back(Value::string(std::move(s)));
        }
      }
      return out;
    }
    case Type::Object:
      if (auto* it = dynamic_cast<IterObj*>(v.obj.get())) return it->take();
      [[fallthrough]];
    default: py_raise("TypeError", "'" + type_name(v) + "' object is not iterable");
  }
}

int64_t py_len(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return 0;
    case Type::String: return static_cast<int64_t>(uni::length(v.s));
    case Type::List: return static_cast<int64_t>(v.list->size());
    case Type::Dict: return static_cast<int64_t>(v.dict->size());
    case Type::Object:
      if (auto* it = dynamic_cast<IterObj*>(v.obj.get()); it && it->view) return static_cast<int64_t>(it->items.size());
      [[fallthrough]];
    default: py_raise("TypeError", "object of type '" + type_name(v) + "' has no len()");
  }
}

std::string escape_html(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace bonsai::tpl
