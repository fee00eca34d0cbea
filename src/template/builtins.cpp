// jinja2 builtin filters and tests, Python str/dict/list methods, globals and %-formatting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "template/chat_template.h"
#include "template/interp.h"
#include "template/unicode.h"

namespace bonsai::tpl {

namespace {

using Opt = std::optional<Value>;

// Binds positional + keyword arguments to named parameters (Python call semantics).
std::vector<Opt> bind(const char* fn, CallArgs& a, std::initializer_list<const char*> names) {
  std::vector<const char*> ns(names);
  if (a.pos.size() > ns.size())
    py_raise("TypeError", std::string(fn) + "() takes at most " + std::to_string(ns.size()) + " argument(s) (" +
                              std::to_string(a.pos.size()) + " given)");
  std::vector<Opt> out(ns.size());
  for (size_t k = 0; k < a.pos.size(); ++k) out[k] = a.pos[k];
  for (auto& kv : a.kw) {
    size_t k = 0;
    while (k < ns.size() && kv.first != ns[k]) ++k;
    if (k == ns.size())
      py_raise("TypeError", std::string(fn) + "() got an unexpected keyword argument " + repr_str(kv.first));
    if (out[k]) py_raise("TypeError", std::string(fn) + "() got multiple values for argument " + repr_str(kv.first));
    out[k] = kv.second;
  }
  return out;
}

Value arg(const Opt& o, Value def) { return o ? *o : std::move(def); }

// soft_str: strings pass through (Markup kept), everything else becomes str(value).
Value soft_str(const Value& v) {
  if (v.is_string()) return v;
  return Value::string(to_str(v));
}

int64_t need_int(const Value& v, const char* what) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_intlike())
    py_raise("TypeError", "'" + type_name(v) + "' object cannot be interpreted as an integer" +
                              (what && *what ? std::string(" (") + what + ")" : ""));
  return v.as_int();
}

std::string need_str(const Value& v, const char* what) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) py_raise("TypeError", std::string(what) + " must be str, not " + type_name(v));
  return v.s;
}

// ---- Python str helpers on code points ----------------------------------------------------

using U32 = std::u32string;

bool in_set(char32_t c, const U32* chars) {
  if (!chars) return uni::is_space(c);
  return chars->find(c) != U32::npos;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  U32 set;
  const U32* cs = nullptr;
  if (!chars.is_none() && !chars.is_undefined()) {
    if (!chars.is_string()) py_raise("TypeError", "strip arg must be None or str");
    set = uni::decode(chars.s);
    cs = &set;
  }
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t p = b;
      if (!in_set(uni::next_cp(s, p), cs)) break;
      b = p;
    }
  }
  if (right) {
    while (e > b) {
      size_t p = e;
      if (!in_set(uni::prev_cp(s, p), cs)) break;
      e = p;
    }
  }
  return s.substr(b, e - b);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& nw, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    U32 u = uni::decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (done < count) {
        out += nw;
        ++done;
      }
      if (k < u.size()) uni::append_utf8(out, u[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (done < count) {
    size_t f = s.find(old, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += nw;
    pos = f + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

List py_split(const std::string& s, const Value& sepv, int64_t maxsplit) {
  List out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sepv.is_none() || sepv.is_undefined()) {
    U32 u = uni::decode(s);
    size_t i = 0, n = u.size();
    int64_t splits = 0;
    while (true) {
      while (i < n && uni::is_space(u[i])) ++i;
      if (i >= n) break;
      if (splits >= maxsplit) {
        out.push_back(Value::string(uni::encode(U32(u.substr(i)))));
        break;
      }
      size_t j = i;
      while (j < n && !uni::is_space(u[j])) ++j;
      out.push_back(Value::string(uni::encode(U32(u.substr(i, j - i)))));
      ++splits;
      i = j;
    }
    return out;
  }
  std::string sep = need_str(sepv, "separator");
  if (sep.empty()) py_raise("ValueError", "empty separator");
  size_t pos = 0;
  int64_t splits = 0;
  while (splits < maxsplit) {
    size_t f = s.find(sep, pos);
    if (f == std::string::npos) break;
    out.push_back(Value::string(s.substr(pos, f - pos)));
    pos = f + sep.size();
    ++splits;
  }
  out.push_back(Value::string(s.substr(pos)));
  return out;
}

List py_rsplit(const std::string& s, const Value& sepv, int64_t maxsplit) {
  List out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sepv.is_none() || sepv.is_undefined()) {
    U32 u = uni::decode(s);
    size_t j = u.size();
    int64_t splits = 0;
    while (true) {
      while (j > 0 && uni::is_space(u[j - 1])) --j;
      if (j == 0) break;
      if (splits >= maxsplit) {
        out.push_back(Value::string(uni::encode(U32(u.substr(0, j)))));
        break;
      }
      size_t i = j;
      while (i > 0 && !uni::is_space(u[i - 1])) --i;
      out.push_back(Value::string(uni::encode(U32(u.substr(i, j - i)))));
      ++splits;
      j = i;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::string sep = need_str(sepv, "separator");
  if (sep.empty()) py_raise("ValueError", "empty separator");
  size_t end = s.size();
  int64_t splits = 0;
  while (splits < maxsplit && end >= sep.size()) {
    size_t f = s.rfind(sep, end - sep.size());
    if (f == std::string::npos) break;
    out.push_back(Value::string(s.substr(f + sep.size(), end - f - sep.size())));
    end = f;
    ++splits;
  }
  out.push_back(Value::string(s.substr(0, end)));
  std::reverse(out.begin(), out.end());
  return out;
}

List py_splitlines(const std::string& s, bool keepends) {
  U32 u = uni::decode(s);
  List out;
  size_t i = 0, n = u.size();
  while (i < n) {
    size_t j = i;
    while (j < n && !uni::is_linebreak(u[j])) ++j;
    size_t eol = j;
    if (j < n) {
      if (u[j] == '\r' && j + 1 < n && u[j + 1] == '\n')
        j += 2;
      else
        ++j;
      if (keepends) eol = j;
    }
    out.push_back(Value::string(uni::encode(U32(u.substr(i, eol - i)))));
    i = j;
  }
  return out;
}

// Clamps Python-style [start:end] bounds against a length.
void clamp_range(const Opt& start, const Opt& end, int64_t len, int64_t& b, int64_t& e) {
  b = 0;
  e = len;
  if (start && !start->is_none()) {
    b = need_int(*start, "start");
    if (b < 0) b = std::max<int64_t>(0, b + len);
  }
  if (end && !end->is_none()) {
    e = need_int(*end, "end");
    if (e < 0) e = std::max<int64_t>(0, e + len);
  }
  e = std::min(e, len);
}

int64_t py_find(const std::string& s, const std::string& sub, const Opt& start, const Opt& end, bool reverse) {
  U32 u = uni::decode(s), w = uni::decode(sub);
  int64_t b, e;
  clamp_range(start, end, static_cast<int64_t>(u.size()), b, e);
  if (b > e || e - b < static_cast<int64_t>(w.size())) return -1;
  U32 hay = u.substr(static_cast<size_t>(b), static_cast<size_t>(e - b));
  size_t f = reverse ? hay.rfind(w) : hay.find(w);
  return f == U32::npos ? -1 : b + static_cast<int64_t>(f);
}

int64_t py_count(const std::string& s, const std::string& sub, const Opt& start, const Opt& end) {
  U32 u = uni::decode(s), w = uni::decode(sub);
  int64_t b, e;
  clamp_range(start, end, static_cast<int64_t>(u.size()), b, e);
  if (b > e) return 0;
  U32 hay = u.substr(static_cast<size_t>(b), static_cast<size_t>(e - b));
  if (w.empty()) return static_cast<int64_t>(hay.size()) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = hay.find(w, pos)) != U32::npos) {
    ++n;
    pos += w.size();
  }
  return n;
}

bool py_affix(const std::string& s, const Value& affix, const Opt& start, const Opt& end, bool suffix) {
  std::string sub = s;
  if ((start && !start->is_none()) || (end && !end->is_none())) {
    U32 u = uni::decode(s);
    int64_t b, e;
    clamp_range(start, end, static_cast<int64_t>(u.size()), b, e);
    if (b > static_cast<int64_t>(u.size())) return false;
    sub = b <= e ? uni::encode(U32(u.substr(static_cast<size_t>(b), static_cast<size_t>(e - b)))) : std::string();
  }
  auto test = [&](const Value& a) {
    if (!a.is_string())
      py_raise("TypeError", std::string(suffix ? "endswith" : "startswith") +
                                " first arg must be str or a tuple of str, not " + type_name(a));
    if (a.s.size() > sub.size()) return false;
    return suffix ? sub.compare(sub.size() - a.s.size(), a.s.size(), a.s) == 0 : sub.compare(0, a.s.size(), a.s) == 0;
  };
  if (affix.is_tuple()) {
    for (const Value& a : *affix.list)
      if (test(a)) return true;
    return false;
  }
  return test(affix);
}

std::string py_pad(const std::string& s, int64_t width, const std::string& fill, int mode /*0 center,1 ljust,2 rjust*/) {
  int64_t len = static_cast<int64_t>(uni::length(s));
  if (width <= len) return s;
  int64_t marg = width - len;
  int64_t left = mode == 0 ? marg / 2 + (marg & width & 1) : mode == 1 ? 0 : marg;
  int64_t right = marg - left;
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < right; ++k) out += fill;
  return out;
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (char32_t c : uni::decode(s))
    if (!pred(c)) return false;
  return true;
}

// ---- number parsing like Python int()/float() ---------------------------------------------

std::optional<double> parse_py_float(const std::string& in) {
  std::string t = py_strip(in, Value::none(), true, true);
  std::string s;
  for (size_t k = 0; k < t.size(); ++k) {
    if (t[k] == '_') {
      if (k == 0 || k + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[k + 1])))
        return std::nullopt;
      continue;
    }
    s += t[k];
  }
  if (s.empty()) return std::nullopt;
  std::string low = uni::lower(s);
  size_t p = 0;
  if (low[0] == '+' || low[0] == '-') p = 1;
  std::string body = low.substr(p);
  double sign = (low[0] == '-') ? -1.0 : 1.0;
  if (body == "inf" || body == "infinity") return sign * INFINITY;
  if (body == "nan") return std::nan("");
  // validate: digits [. digits] | . digits, then optional exponent
  size_t i = 0, n = body.size();
  size_t d1 = 0;
  while (i < n && std::isdigit(static_cast<unsigned char>(body[i]))) ++i, ++d1;
  size_t d2 = 0;
  if (i < n && body[i] == '.') {
    ++i;
    while (i < n && std::isdigit(static_cast<unsigned char>(body[i]))) ++i, ++d2;
  }
  if (d1 + d2 == 0) return std::nullopt;
  if (i < n && body[i] == 'e') {
    ++i;
    if (i < n && (body[i] == '+' || body[i] == '-')) ++i;
    size_t d3 = 0;
    while (i < n && std::isdigit(static_cast<unsigned char>(body[i]))) ++i, ++d3;
    if (d3 == 0) return std::nullopt;
  }
  if (i != n) return std::nullopt;
  return std::strtod(s.c_str(), nullptr);
}

std::optional<int64_t> parse_py_int(const std::string& in, int base) {
  std::string t = py_strip(in, Value::none(), true, true);
  if (t.empty()) return std::nullopt;
  size_t p = 0;
  bool neg = false;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    p = 1;
  }
  if (p + 1 < t.size() && t[p] == '0') {
    char k = static_cast<char>(t[p + 1] | 0x20);
    if ((k == 'x' && (base == 16 || base == 0)) || (k == 'o' && (base == 8 || base == 0)) ||
        (k == 'b' && (base == 2 || base == 0))) {
      base = k == 'x' ? 16 : k == 'o' ? 8 : 2;
      p += 2;
      if (p < t.size() && t[p] == '_') ++p;
    }
  }
  if (base == 0) base = 10;
  if (p >= t.size()) return std::nullopt;
  int64_t v = 0;
  bool prev_digit = false;
  for (size_t k = p; k < t.size(); ++k) {
    char c = t[k];
    if (c == '_') {
      if (!prev_digit || k + 1 >= t.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c)) ? (c | 0x20) - 'a' + 10
                                                          : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
      py_raise("OverflowError", "integer literal too large for this implementation");
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return neg ? -v : v;
}

// Python round(x, ndigits) for floats: correctly rounded, ties to even.
double py_round_float(double x, int64_t nd) {
  if (!std::isfinite(x) || x == 0.0) return x;
  if (nd > 330) return x;
  if (nd < -330) return std::copysign(0.0, x);
  static thread_local std::vector<char> buf(1500);
  std::snprintf(buf.data(), buf.size(), "%.1100f", std::fabs(x));
  std::string s(buf.data());
  size_t dot = s.find('.');
  std::string digits = s.substr(0, dot) + s.substr(dot + 1);
  int64_t intlen = static_cast<int64_t>(dot);
  int64_t keep = intlen + nd;  // number of leading digits kept
  if (keep < 0) return std::copysign(0.0, x);
  std::string head = digits.substr(0, static_cast<size_t>(keep));
  std::string tail = digits.substr(static_cast<size_t>(keep));
  bool round_up = false;
  if (!tail.empty()) {
    if (tail[0] > '5') {
      round_up = true;
    } else if (tail[0] == '5') {
      bool rest_zero = tail.find_first_not_of('0', 1) == std::string::npos;
      if (!rest_zero) {
        round_up = true;
      } else {
        int last = head.empty() ? 0 : head.back() - '0';
        round_up = (last % 2) == 1;
      }
    }
  }
  if (head.empty()) head = "0", keep = 1, intlen += 1, digits = "0" + digits;
  if (round_up) {
    int k = static_cast<int>(head.size()) - 1;
    while (k >= 0) {
      if (head[static_cast<size_t>(k)] == '9') {
        head[static_cast<size_t>(k)] = '0';
        --k;
      } else {
        ++head[static_cast<size_t>(k)];
        break;
      }
    }
    if (k < 0) {
      head.insert(head.begin(), '1');
      ++intlen;
    }
  }
  std::string num;
  if (nd >= 0) {
    num = head.substr(0, static_cast<size_t>(intlen)) + "." + head.substr(static_cast<size_t>(intlen));
  } else {
    num = head + std::string(static_cast<size_t>(-nd), '0');
  }
  double r = std::strtod(num.c_str(), nullptr);
  return std::copysign(r, x);
}

int64_t py_round_int(int64_t v, int64_t nd) {
  if (nd >= 0) return v;
  if (nd < -18) return 0;
  int64_t p = 1;
  for (int64_t k = 0; k < -nd; ++k) p *= 10;
  int64_t q = v / p, r = v % p;
  if (r < 0) {
    r += p;
    --q;
  }
  if (2 * r > p || (2 * r == p && (q % 2 != 0))) ++q;
  return q * p;
}

// ---- attribute getters used by map/select/sort/... ----------------------------------------

struct AttrGetter {
  std::vector<Value> parts;
  std::optional<Value> def;
  bool lower = false;
  Value operator()(Interp& in, Value item) const {
    for (const Value& p : parts) {
      item = in.getitem(item, p);
      if (def && item.is_undefined()) item = *def;
    }
    if (lower && item.is_string()) item = Value::string(uni::lower(item.s), item.flag);
    return item;
  }
};

AttrGetter make_attrgetter(const Value& attribute, bool lower, std::optional<Value> def = std::nullopt) {
  AttrGetter g;
  g.lower = lower;
  g.def = std::move(def);
  if (attribute.is_string()) {
    std::string a = attribute.s;
    size_t pos = 0;
    while (true) {
      size_t f = a.find('.', pos);
      std::string part = a.substr(pos, f == std::string::npos ? std::string::npos : f - pos);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      g.parts.push_back(digits ? Value::integer(std::stoll(part)) : Value::string(part));
      if (f == std::string::npos) break;
      pos = f + 1;
    }
  } else if (!attribute.is_none()) {
    g.parts.push_back(attribute);
  }
  return g;
}

Value ignore_case(const Value& v) {
  if (v.is_string()) return Value::string(uni::lower(v.s), v.flag);
  return v;
}

void check_hashable(const Value& v) {
  if (v.is_list()) py_raise("TypeError", "unhashable type: 'list'");
  if (v.is_dict()) py_raise("TypeError", "unhashable type: 'dict'");
  if (v.is_tuple())
    for (const Value& x : *v.list) check_hashable(x);
}

// ---- filters ------------------------------------------------------------------------------

// Runs a generator filter's body; Python raises its errors only when the generator is consumed.
template <class F>
Value lazy_generator(const char* owner, F&& body) {
  try {
    return make_iter("generator", body(), owner);
  } catch (const PyError& e) {
    Value v = make_iter("generator", {}, owner);
    v.as<IterObj>()->error = std::make_shared<PyError>(e);
    return v;
  }
}

Value f_abs(Interp&, const Value& v, CallArgs& a) {
  bind("abs", a, {});
  if (v.is_intlike()) {
    int64_t x = v.as_int();
    if (x == INT64_MIN) py_raise("OverflowError", "integer overflow");
    return Value::integer(x < 0 ? -x : x);
  }
  if (v.is_float()) return Value::number(std::fabs(v.f));
  py_raise("TypeError", "bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("attr", a, {"name"});
  if (!p[0]) py_raise("TypeError", "do_attr() missing 1 required positional argument: 'name'");
  std::string name = to_str(*p[0]);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_object()) {
    Value out;
    if (v.obj->get_attr(name, out)) return out;
  } else if (is_unsafe_method_of(v, name)) {
    return Value::undefined("access to attribute " + repr_str(name) + " of " + repr_str(type_name(v)) +
                            " object is unsafe.");
  } else if (is_method_of(v, name)) {
    auto m = std::make_shared<BoundMethod>();
    m->self = v;
    m->name = name;
    return Value::object(std::move(m));
  }
  return undefined_attr(v, name);
}

Value f_batch(Interp&, const Value& v, CallArgs& a) {
  return lazy_generator("do_batch", [&]() -> List {
    auto p = bind("batch", a, {"linecount", "fill_with"});
    if (!p[0]) py_raise("TypeError", "do_batch() missing 1 required positional argument: 'linecount'");
    int64_t n = need_int(*p[0], "linecount");
    Value fill = arg(p[1], Value::none());
    List out, tmp;
    for (auto& x : iterate(v)) {
      if (static_cast<int64_t>(tmp.size()) == n) {
        out.push_back(Value::make_list(std::move(tmp)));
        tmp.clear();
      }
      tmp.push_back(std::move(x));
    }
    if (!tmp.empty()) {
      if (!fill.is_none())
        while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(fill);
      out.push_back(Value::make_list(std::move(tmp)));
    }
    return out;
  });
}

Value f_capitalize(Interp&, const Value& v, CallArgs& a) {
  bind("capitalize", a, {});
  Value s = soft_str(v);
  return Value::string(uni::capitalize(s.s), s.flag);
}

Value f_center(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("center", a, {"width"});
  Value s = soft_str(v);
  return Value::string(py_pad(s.s, need_int(arg(p[0], Value::integer(80)), "width"), " ", 0), s.flag);
}

Value f_length(Interp&, const Value& v, CallArgs& a) {
  bind("length", a, {});
  return Value::integer(py_len(v));
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("default", a, {"default_value", "boolean"});
  Value def = arg(p[0], Value::string(""));
  bool boolean = truthy(arg(p[1], Value::boolean(false)));
  if (v.is_undefined() || (boolean && !truthy(v))) return def;
  return v;
}

Value f_dictsort(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("dictsort", a, {"case_sensitive", "by", "reverse"});
  bool cs = truthy(arg(p[0], Value::boolean(false)));
  Value by = arg(p[1], Value::string("key"));
  bool rev = truthy(arg(p[2], Value::boolean(false)));
  int pos;
  if (by.is_string() && by.s == "key")
    pos = 0;
  else if (by.is_string() && by.s == "value")
    pos = 1;
  else
    py_raise("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_dict()) py_raise("AttributeError", "'" + type_name(v) + "' object has no attribute 'items'");
  std::vector<std::pair<Value, Value>> items;  // (key for sorting, tuple)
  for (const auto& kv : v.dict->items) {
    Value k = Value::string(kv.first);
    Value sortkey = pos == 0 ? k : kv.second;
    if (!cs) sortkey = ignore_case(sortkey);
    items.emplace_back(sortkey, Value::make_list({k, kv.second}, true));
  }
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return rev ? less(y.first, x.first) : less(x.first, y.first);
  });
  List out;
  for (auto& it : items) out.push_back(std::move(it.second));
  return Value::make_list(std::move(out));
}

Value f_escape(Interp&, const Value& v, CallArgs& a) {
  bind("escape", a, {});
  if (v.is_markup()) return v;
  return Value::string(escape_html(to_str(v)), true);
}

Value f_forceescape(Interp&, const Value& v, CallArgs& a) {
  bind("forceescape", a, {});
  return Value::string(escape_html(to_str(v)), true);
}

Value f_first(Interp&, const Value& v, CallArgs& a) {
  bind("first", a, {});
  if (IterObj* it = v.as<IterObj>(); it && !it->view) {
    if (it->pos >= it->items.size()) return Value::undefined("No first item, sequence was empty.");
    return it->items[it->pos++];
  }
  List xs = iterate(v);
  if (xs.empty()) return Value::undefined("No first item, sequence was empty.");
  return xs.front();
}

Value f_last(Interp&, const Value& v, CallArgs& a) {
  bind("last", a, {});
  IterObj* it = v.as<IterObj>();
  if ((!v.is_seq() && !v.is_dict() && !v.is_string() && !v.is_undefined() && !it) || (it && !it->view))
    py_raise("TypeError", "'" + type_name(v) + "' object is not reversible");
  List xs = iterate(v);
  if (xs.empty()) return Value::undefined("No last item, sequence was empty.");
  return xs.back();
}

Value f_float(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("float", a, {"default"});
  Value def = arg(p[0], Value::number(0.0));
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    auto d = parse_py_float(v.s);
    if (d) return Value::number(*d);
  }
  return def;
}

Value f_format(Interp&, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty())
    py_raise("FilterArgumentError", "can't handle positional and keyword arguments at the same time");
  Value s = soft_str(v);
  Value args;
  if (!a.kw.empty()) {
    Dict d;
    for (auto& kv : a.kw) d.set(kv.first, kv.second);
    args = Value::make_dict(std::move(d));
  } else {
    args = Value::make_list(a.pos, true);
  }
  return Value::string(py_percent_format(s.s, args), s.flag);
}

Value f_indent(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("indent", a, {"width", "first", "blank"});
  Value w = arg(p[0], Value::integer(4));
  bool first = truthy(arg(p[1], Value::boolean(false)));
  bool blank = truthy(arg(p[2], Value::boolean(false)));
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_list()) py_raise("AttributeError", "'list' object has no attribute 'splitlines'");
  if (v.is_tuple()) py_raise("TypeError", "can only concatenate tuple (not \"str\") to tuple");
  if (!v.is_string()) py_raise("TypeError", "unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  std::string ind;
  if (w.is_string()) {
    ind = w.s;
  } else {
    int64_t n = need_int(w, "width");
    if (n > 0) ind.assign(static_cast<size_t>(n), ' ');
  }
  List lines = py_splitlines(v.s + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + ind;
      rv += lines[k].s;
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0].s;
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t k = 1; k < lines.size(); ++k) {
        if (k > 1) rv += "\n";
        if (!lines[k].s.empty()) rv += ind;
        rv += lines[k].s;
      }
    }
  }
  if (first) rv = ind + rv;
  return Value::string(std::move(rv), v.flag);
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("int", a, {"default", "base"});
  Value def = arg(p[0], Value::integer(0));
  int64_t base = need_int(arg(p[1], Value::integer(10)), "base");
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_intlike()) return Value::integer(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.f)) return def;
    return Value::integer(static_cast<int64_t>(std::trunc(v.f)));
  }
  if (v.is_string()) {
    if (auto i = parse_py_int(v.s, static_cast<int>(base))) return Value::integer(*i);
    if (auto d = parse_py_float(v.s)) {
      if (!std::isfinite(*d)) return def;
      return Value::integer(static_cast<int64_t>(std::trunc(*d)));
    }
  }
  return def;
}

Value f_items(Interp&, const Value& v, CallArgs& a) {
  return lazy_generator("do_items", [&]() -> List {
    bind("items", a, {});
    List out;
    if (!v.is_undefined()) {
      if (!v.is_dict()) py_raise("TypeError", "Can only get item pairs from a mapping.");
      for (const auto& kv : v.dict->items) out.push_back(Value::make_list({Value::string(kv.first), kv.second}, true));
    }
    return out;
  });
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind("join", a, {"d", "attribute"});
  std::string d = to_str(arg(p[0], Value::string("")));
  List xs = iterate(v);
  if (p[1] && !p[1]->is_none()) {
    AttrGetter g = make_attrgetter(*p[1], false);
    for (auto& x : xs) x = g(in, x);
  }
  std::string out;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (k) out += d;
    out += to_str(xs[k]);
  }
  return Value::string(std::move(out));
}

Value f_list(Interp&, const Value& v, CallArgs& a) {
  bind("list", a, {});
  return Value::make_list(iterate(v));
}

Value f_lower(Interp&, const Value& v, CallArgs& a) {
  bind("lower", a, {});
  Value s = soft_str(v);
  return Value::string(uni::lower(s.s), s.flag);
}

Value f_upper(Interp&, const Value& v, CallArgs& a) {
  bind("upper", a, {});
  Value s = soft_str(v);
  return Value::string(uni::upper(s.s), s.flag);
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  return lazy_generator("sync_do_map", [&]() -> List {
    List out;
    if (!truthy(v)) return List{};
    Value attribute;
    if (a.pos.empty() && a.take_kw("attribute", attribute)) {
      Value def;
      bool has_def = a.take_kw("default", def);
      if (!a.kw.empty()) py_raise("FilterArgumentError", "Unexpected keyword argument " + repr_str(a.kw[0].first));
      AttrGetter g = make_attrgetter(attribute, false, has_def ? std::optional<Value>(def) : std::nullopt);
      for (auto& x : iterate(v)) out.push_back(g(in, x));
      return out;
    }
    if (a.pos.empty()) py_raise("FilterArgumentError", "map requires a filter argument");
    std::string name = to_str(a.pos[0]);
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (auto& x : iterate(v)) {
      CallArgs c = rest;
      out.push_back(in.call_filter(name, x, c));
    }
    return out;
  });
}

Value min_max(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  auto p = bind(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  bool cs = truthy(arg(p[0], Value::boolean(false)));
  Value attribute = arg(p[1], Value::none());
  List xs = iterate(v);
  if (xs.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  AttrGetter g = make_attrgetter(attribute, !cs);
  size_t best = 0;
  Value bk = g(in, xs[0]);
  for (size_t k = 1; k < xs.size(); ++k) {
    Value key = g(in, xs[k]);
    if (want_max ? less(key, bk, ">") : less(key, bk, "<")) {
      best = k;
      bk = key;
    }
  }
  return xs[best];
}

Value f_max(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

Value select_or_reject(Interp& in, const Value& v, CallArgs& a, bool select, bool lookup_attr) {
  const char* owner = select ? (lookup_attr ? "sync_do_selectattr" : "sync_do_select")
                             : (lookup_attr ? "sync_do_rejectattr" : "sync_do_reject");
  return lazy_generator(owner, [&]() -> List {
    List out;
    if (!truthy(v)) return List{};
    size_t off = 0;
    std::optional<AttrGetter> g;
    if (lookup_attr) {
      if (a.pos.empty()) py_raise("FilterArgumentError", "Missing parameter for attribute name");
      g = make_attrgetter(a.pos[0], false);
      off = 1;
    }
    std::optional<std::string> test;
    CallArgs targs;
    if (a.pos.size() > off) {
      test = to_str(a.pos[off]);
      targs.pos.assign(a.pos.begin() + static_cast<long>(off) + 1, a.pos.end());
      targs.kw = a.kw;
    }
    for (auto& x : iterate(v)) {
      Value t = g ? (*g)(in, x) : x;
      bool r;
      if (test) {
        CallArgs c = targs;
        r = in.call_test(*test, t, c);
      } else {
        r = truthy(t);
      }
      if (r == select) out.push_back(x);
    }
    return out;
  });
}

Value f_select(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, false); }
Value f_reject(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, true); }

Value f_replace(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("replace", a, {"old", "new", "count"});
  if (!p[0] || !p[1]) py_raise("TypeError", "do_replace() missing required arguments 'old' and 'new'");
  int64_t count = -1;
  if (p[2] && !p[2]->is_none()) count = need_int(*p[2], "count");
  return Value::string(py_replace(to_str(v), to_str(*p[0]), to_str(*p[1]), count));
}

Value f_reverse(Interp&, const Value& v, CallArgs& a) {
  bind("reverse", a, {});
  if (v.is_string()) return slice_value(v, Value::none(), Value::none(), Value::integer(-1));
  IterObj* it = v.as<IterObj>();
  if (!v.is_seq() && !v.is_dict() && !v.is_undefined() && !it)
    py_raise("FilterArgumentError", "argument must be iterable");
  List xs = iterate(v);
  std::reverse(xs.begin(), xs.end());
  if (it && !it->view) return Value::make_list(std::move(xs));  // reversed() fails, list(value) reversed
  std::string name = v.is_list() ? "list_reverseiterator"
                     : v.is_dict() ? "dict_reversekeyiterator"
                     : it ? (it->name == "dict_items" ? "dict_reverseitemiterator"
                             : it->name == "dict_values" ? "dict_reversevalueiterator" : "dict_reversekeyiterator")
                          : "reversed";
  return make_iter(name, std::move(xs));
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("round", a, {"precision", "method"});
  int64_t prec = need_int(arg(p[0], Value::integer(0)), "precision");
  std::string method = to_str(arg(p[1], Value::string("common")));
  if (method != "common" && method != "ceil" && method != "floor")
    py_raise("FilterArgumentError", "method must be common, ceil or floor");
  if (method == "common") {
    if (!v.is_number()) py_raise("TypeError", "type " + type_name(v) + " doesn't define __round__ method");
    if (v.is_intlike()) return Value::integer(py_round_int(v.as_int(), prec));
    return Value::number(py_round_float(v.f, prec));
  }
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) py_raise("TypeError", "must be real number, not " + type_name(v));
  double scale = std::pow(10.0, static_cast<double>(prec));
  double x = v.as_double() * scale;
  double r = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::number(r / scale);
}

Value f_safe(Interp&, const Value& v, CallArgs& a) {
  bind("safe", a, {});
  if (v.is_string()) return Value::string(v.s, true);
  return Value::string(to_str(v), true);
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind("sort", a, {"reverse", "case_sensitive", "attribute"});
  bool rev = truthy(arg(p[0], Value::boolean(false)));
  bool cs = truthy(arg(p[1], Value::boolean(false)));
  Value attribute = arg(p[2], Value::none());
  List xs = iterate(v);
  std::vector<AttrGetter> getters;
  if (attribute.is_string() && attribute.s.find(',') != std::string::npos) {
    size_t pos = 0;
    while (true) {
      size_t f = attribute.s.find(',', pos);
      getters.push_back(make_attrgetter(Value::string(attribute.s.substr(pos, f == std::string::npos ? f : f - pos)), !cs));
      if (f == std::string::npos) break;
      pos = f + 1;
    }
  } else {
    getters.push_back(make_attrgetter(attribute, !cs));
  }
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(xs.size());
  for (auto& x : xs) {
    // jinja2's make_multi_attrgetter: the key is always a list (so Undefined keys compare equal).
    List parts;
    for (const auto& g : getters) parts.push_back(g(in, x));
    Value key = Value::make_list(std::move(parts));
    keyed.emplace_back(std::move(key), std::move(x));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? less(y.first, x.first) : less(x.first, y.first);
  });
  List out;
  out.reserve(keyed.size());
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::make_list(std::move(out));
}

Value f_string(Interp&, const Value& v, CallArgs& a) {
  bind("string", a, {});
  return soft_str(v);
}

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind("sum", a, {"attribute", "start"});
  Value total = arg(p[1], Value::integer(0));
  List xs = iterate(v);
  std::optional<AttrGetter> g;
  if (p[0] && !p[0]->is_none()) g = make_attrgetter(*p[0], false);
  for (auto& x : xs) {
    Value item = g ? (*g)(in, x) : x;
    if (item.is_string()) py_raise("TypeError", "unsupported operand type(s) for +: '" + type_name(total) + "' and 'str'");
    total = binop("+", total, item);
  }
  return total;
}

Value f_title(Interp&, const Value& v, CallArgs& a) {
  bind("title", a, {});
  Value s = soft_str(v);
  // jinja2: re.split(r"([-\s({\[<]+)") and upper-case the first letter of every piece.
  U32 u = uni::decode(s.s);
  std::string out;
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || uni::is_space(c); };
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    U32 first;
    uni::to_upper(u[i], first);
    out += uni::encode(first);
    out += uni::lower(uni::encode(U32(u.substr(i + 1, j - i - 1))));  // item[1:].lower(): own sigma context
    i = j;
  }
  return Value::string(std::move(out), s.flag);
}

Value f_tojson(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = truthy(arg(p[0], Value::boolean(false)));
  Value indent = arg(p[1], Value::none());
  if (!indent.is_none()) {
    o.has_indent = true;
    o.item_sep = ",";
    if (indent.is_string()) {
      o.indent = indent.s;
    } else {
      int64_t n = need_int(indent, "indent");
      if (n > 0) o.indent.assign(static_cast<size_t>(n), ' ');
    }
  }
  Value seps = arg(p[2], Value::none());
  if (!seps.is_none()) {
    if (!seps.is_seq() || seps.list->size() != 2 || !(*seps.list)[0].is_string() || !(*seps.list)[1].is_string())
      py_raise("TypeError", "tojson separators must be a pair of strings");
    o.item_sep = (*seps.list)[0].s;
    o.key_sep = (*seps.list)[1].s;
  }
  o.sort_keys = truthy(arg(p[3], Value::boolean(false)));
  return Value::string(json_dumps(v, o));
}

Value f_trim(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("trim", a, {"chars"});
  Value s = soft_str(v);
  return Value::string(py_strip(s.s, arg(p[0], Value::none()), true, true), s.flag);
}

Value f_truncate(Interp&, const Value& v, CallArgs& a) {
  auto p = bind("truncate", a, {"length", "killwords", "end", "leeway"});
  int64_t length = need_int(arg(p[0], Value::integer(255)), "length");
  bool killwords = truthy(arg(p[1], Value::boolean(false)));
  std::string end = to_str(arg(p[2], Value::string("...")));
  int64_t leeway = need_int(arg(p[3], Value::integer(5)), "leeway");
  int64_t endlen = static_cast<int64_t>(uni::length(end));
  if (length < endlen) py_raise("AssertionError", "expected length >= " + std::to_string(endlen) + ", got " + std::to_string(length));
  if (leeway < 0) py_raise("AssertionError", "expected leeway >= 0, got " + std::to_string(leeway));
  if (!v.is_string()) {
    if (py_len(v) <= length + leeway) return v;
    py_raise("TypeError", "truncate of a " + type_name(v) + " value is not supported");
  }
  std::string s = v.s;
  U32 u = uni::decode(s);
  if (static_cast<int64_t>(u.size()) <= length + leeway) return v;
  std::string head = uni::encode(U32(u.substr(0, static_cast<size_t>(length - endlen))));
  if (killwords) return Value::string(head + end);
  size_t sp = head.rfind(' ');
  if (sp != std::string::npos) head = head.substr(0, sp);
  return Value::string(head + end);
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  return lazy_generator("sync_do_unique", [&]() -> List {
    auto p = bind("unique", a, {"case_sensitive", "attribute"});
    bool cs = truthy(arg(p[0], Value::boolean(false)));
    AttrGetter g = make_attrgetter(arg(p[1], Value::none()), !cs);
    List out, seen;
    for (auto& x : iterate(v)) {
      Value key = g(in, x);
      check_hashable(key);
      bool dup = false;
      for (const Value& s : seen)
        if (equals(s, key)) {
          dup = true;
          break;
        }
      if (!dup) {
        seen.push_back(key);
        out.push_back(x);
      }
    }
    return out;
  });
}

Value f_wordcount(Interp&, const Value& v, CallArgs& a) {
  bind("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : uni::decode(to_str(v))) {
    bool w = uni::is_word(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

// ---- tests --------------------------------------------------------------------------------

bool t_defined(Interp&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interp&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interp&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interp&, const Value& v, CallArgs&) { return v.is_bool() && v.b; }
bool t_false(Interp&, const Value& v, CallArgs&) { return v.is_bool() && !v.b; }
bool t_integer(Interp&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interp&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Interp&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Interp&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interp&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_seq() || v.is_dict() || v.as<LoopObj>() != nullptr ||
         v.as<IterObj>() != nullptr;
}
bool t_sequence(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_seq() || v.is_dict();
}
bool t_callable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || (v.is_object() && v.obj->callable());
}
bool t_escaped(Interp&, const Value& v, CallArgs&) { return v.is_markup(); }
bool t_lower(Interp&, const Value& v, CallArgs&) {  // str(v).islower()
  std::string s = to_str(v);
  bool cased = false;
  for (char32_t c : uni::decode(s)) {
    if (uni::is_upper(c) || uni::is_title(c)) return false;
    if (uni::is_lower(c)) cased = true;
  }
  return cased;
}
bool t_upper(Interp&, const Value& v, CallArgs&) {  // str(v).isupper()
  std::string s = to_str(v);
  bool cased = false;
  for (char32_t c : uni::decode(s)) {
    if (uni::is_lower(c) || uni::is_title(c)) return false;
    if (uni::is_upper(c)) cased = true;
  }
  return cased;
}

Value one_arg(const char* name, CallArgs& a, const char* param) {
  auto p = bind(name, a, {param});
  if (!p[0]) py_raise("TypeError", std::string(name) + "() missing 1 required positional argument: '" + param + "'");
  return *p[0];
}

bool t_odd(Interp&, const Value& v, CallArgs& a) {
  bind("odd", a, {});
  return equals(binop("%", v, Value::integer(2)), Value::integer(1));
}
bool t_even(Interp&, const Value& v, CallArgs& a) {
  bind("even", a, {});
  return equals(binop("%", v, Value::integer(2)), Value::integer(0));
}
bool t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  Value n = one_arg("divisibleby", a, "num");
  return equals(binop("%", v, n), Value::integer(0));
}
bool t_eq(Interp&, const Value& v, CallArgs& a) { return equals(v, one_arg("eq", a, "other")); }
bool t_ne(Interp&, const Value& v, CallArgs& a) { return !equals(v, one_arg("ne", a, "other")); }
bool t_lt(Interp&, const Value& v, CallArgs& a) { return less(v, one_arg("lt", a, "other"), "<"); }
bool t_le(Interp&, const Value& v, CallArgs& a) { return less(v, one_arg("le", a, "other"), "<="); }
bool t_gt(Interp&, const Value& v, CallArgs& a) { return less(v, one_arg("gt", a, "other"), ">"); }
bool t_ge(Interp&, const Value& v, CallArgs& a) { return less(v, one_arg("ge", a, "other"), ">="); }
bool t_in(Interp&, const Value& v, CallArgs& a) { return contains(one_arg("in", a, "seq"), v); }
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  Value o = one_arg("sameas", a, "other");
  if (v.type != o.type) return false;
  switch (v.type) {
    case Type::None: return true;
    case Type::Bool: return v.b == o.b;
    case Type::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython small-int cache
    case Type::List: return v.list == o.list;
    case Type::Dict: return v.dict == o.dict;
    case Type::Object: return v.obj == o.obj;
    case Type::String: return v.s == o.s && v.s.size() <= 1;
    default: return false;
  }
}
bool t_filter(Interp&, const Value& v, CallArgs& a) {
  bind("filter", a, {});
  return v.is_string() && find_filter(v.s) != nullptr;
}
bool t_test(Interp&, const Value& v, CallArgs& a) {
  bind("test", a, {});
  return v.is_string() && find_test(v.s) != nullptr;
}

// ---- globals ------------------------------------------------------------------------------

Value g_range(Interp&, CallArgs& a) {
  if (!a.kw.empty()) py_raise("TypeError", "range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3)
    py_raise("TypeError", "range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = need_int(a.pos[0], "");
  } else {
    start = need_int(a.pos[0], "");
    stop = need_int(a.pos[1], "");
    if (a.pos.size() == 3) step = need_int(a.pos[2], "");
  }
  if (step == 0) py_raise("ValueError", "range() arg 3 must not be zero");
  int64_t n = 0;
  if (step > 0 && start < stop) n = (stop - start - 1) / step + 1;
  if (step < 0 && start > stop) n = (start - stop - 1) / (-step) + 1;
  if (n > 100000)
    py_raise("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  List out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) out.push_back(Value::integer(start + k * step));
  return Value::make_list(std::move(out));
}

Dict dict_from_args(const char* fn, CallArgs& a) {
  Dict d;
  if (a.pos.size() > 1) py_raise("TypeError", std::string(fn) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d = *src.dict;
    } else {
      for (const Value& item : iterate(src)) {
        List kv = iterate(item);
        if (kv.size() != 2)
          py_raise("ValueError", "dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        if (!kv[0].is_string()) py_raise("TypeError", "unsupported construct: non-string dict key");
        d.set(kv[0].s, kv[1]);
      }
    }
  }
  for (auto& kv : a.kw) d.set(kv.first, kv.second);
  return d;
}

Value g_dict(Interp&, CallArgs& a) { return Value::make_dict(dict_from_args("dict", a)); }

Value g_namespace(Interp& in, CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  in.track(ns);
  ns->attrs = dict_from_args("namespace", a);
  return Value::object(std::move(ns));
}

Value g_raise_exception(Interp& in, CallArgs& a) {
  std::string msg = a.pos.empty() ? std::string() : to_str(a.pos[0]);
  throw TemplateError(TemplateError::Kind::Raised, msg, in.line(), 0);
}

Value g_strftime_now(Interp&, CallArgs& a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string()) py_raise("TypeError", "strftime_now() takes one format string");
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::vector<char> buf(256 + a.pos[0].s.size() * 8);
  size_t n = std::strftime(buf.data(), buf.size(), a.pos[0].s.c_str(), &tm);
  return Value::string(std::string(buf.data(), n));
}

struct JoinerObj : Object {
  std::string sep;
  bool used = false;
  std::string type_name() const override { return "Joiner"; }
  std::string module() const override { return "jinja2.utils"; }
  bool callable() const override { return true; }
  Value call(Interp&, CallArgs&) override {
    if (!used) {
      used = true;
      return Value::string("");
    }
    return Value::string(sep);
  }
};

Value g_joiner(Interp&, CallArgs& a) {
  auto p = bind("joiner", a, {"sep"});
  auto j = std::make_shared<JoinerObj>();
  j->sep = to_str(arg(p[0], Value::string(", ")));
  return Value::object(std::move(j));
}

// ---- str.format ---------------------------------------------------------------------------

std::string group_thousands(const std::string& digits) {
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int k = 0; k < n; ++k) {
    out += digits[static_cast<size_t>(k)];
    int rem = n - k - 1;
    if (rem > 0 && rem % 3 == 0) out += ',';
  }
  return out;
}

// format(value, spec) for the common mini-language subset.
std::string format_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  size_t i = 0;
  U32 u = uni::decode(spec);
  char32_t fill = ' ';
  char align = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (u.size() >= 2 && is_align(u[1])) {
    fill = u[0];
    align = static_cast<char>(u[1]);
    i = 2;
  } else if (!u.empty() && is_align(u[0])) {
    align = static_cast<char>(u[0]);
    i = 1;
  }
  char sign = '-';
  if (i < u.size() && (u[i] == '+' || u[i] == '-' || u[i] == ' ')) sign = static_cast<char>(u[i++]);
  bool alt = false;
  if (i < u.size() && u[i] == '#') alt = true, ++i;
  if (i < u.size() && u[i] == '0') {
    if (!align) {
      fill = '0';
      align = '=';
    }
    ++i;
  }
  int64_t width = 0;
  while (i < u.size() && u[i] >= '0' && u[i] <= '9') width = width * 10 + (u[i++] - '0');
  bool grouping = false;
  if (i < u.size() && (u[i] == ',' || u[i] == '_')) grouping = true, ++i;
  int prec = -1;
  if (i < u.size() && u[i] == '.') {
    ++i;
    prec = 0;
    while (i < u.size() && u[i] >= '0' && u[i] <= '9') prec = prec * 10 + static_cast<int>(u[i++] - '0');
  }
  char type = 0;
  if (i < u.size()) type = static_cast<char>(u[i++]);
  if (i != u.size()) py_raise("ValueError", "Invalid format specifier");
  std::string body;
  std::string signstr;
  bool numeric = false;
  if (v.is_string() || (type == 's')) {
    if (!v.is_string()) py_raise("ValueError", "Unknown format code 's' for object of type '" + type_name(v) + "'");
    body = v.s;
    if (prec >= 0) body = uni::encode(U32(uni::decode(body).substr(0, static_cast<size_t>(prec))));
    if (!align) align = '<';
  } else if (v.is_number()) {
    numeric = true;
    if (!align) align = '>';
    char buf[512];
    if (v.is_intlike() && (type == 0 || type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'c')) {
      int64_t x = v.as_int();
      uint64_t ax = x < 0 ? static_cast<uint64_t>(-(x + 1)) + 1 : static_cast<uint64_t>(x);
      if (x < 0) signstr = "-";
      else if (sign == '+') signstr = "+";
      else if (sign == ' ') signstr = " ";
      if (type == 'x' || type == 'X' || type == 'o') {
        std::snprintf(buf, sizeof(buf), type == 'x' ? "%llx" : type == 'X' ? "%llX" : "%llo",
                      static_cast<unsigned long long>(ax));
        body = buf;
        if (alt) signstr += type == 'o' ? "0o" : type == 'x' ? "0x" : "0X";
      } else if (type == 'b') {
        body.clear();
        do {
          body.insert(body.begin(), static_cast<char>('0' + (ax & 1)));
          ax >>= 1;
        } while (ax);
        if (alt) signstr += "0b";
      } else if (type == 'c') {
        body.clear();
        uni::append_utf8(body, static_cast<char32_t>(x));
        signstr.clear();
      } else {
        body = std::to_string(ax);
        if (grouping) body = group_thousands(body);
      }
    } else {
      double x = v.as_double();
      if (std::signbit(x) && !std::isnan(x)) signstr = "-";
      else if (sign == '+') signstr = "+";
      else if (sign == ' ') signstr = " ";
      double ax = std::fabs(x);
      char t = type ? type : 'r';
      if (t == 'n') t = 'g';
      if (t == 'r') {
        if (prec >= 0) {
          std::snprintf(buf, sizeof(buf), "%.*g", prec == 0 ? 1 : prec, ax);
          body = buf;
        } else {
          body = float_repr(ax);
        }
      } else if (t == '%') {
        std::snprintf(buf, sizeof(buf), "%.*f", prec < 0 ? 6 : prec, ax * 100.0);
        body = std::string(buf) + "%";
      } else if (t == 'f' || t == 'F' || t == 'e' || t == 'E' || t == 'g' || t == 'G') {
        char f[8] = {'%', '.', '*', t, 0};
        std::snprintf(buf, sizeof(buf), f, prec < 0 ? 6 : prec, ax);
        body = buf;
      } else {
        py_raise("ValueError", std::string("Unknown format code '") + t + "' for object of type '" + type_name(v) + "'");
      }
      if (grouping && (t == 'f' || t == 'F' || t == '%')) {
        size_t dot = body.find_first_not_of("0123456789");
        body = group_thousands(body.substr(0, dot)) + (dot == std::string::npos ? "" : body.substr(dot));
      }
    }
  } else {
    body = to_str(v);
    if (!align) align = '<';
  }
  std::string full = signstr + body;
  int64_t len = static_cast<int64_t>(uni::length(full));
  if (width <= len) return full;
  std::string pad;
  int64_t padn = width - len;
  std::string fills;
  uni::append_utf8(fills, fill);
  auto rep = [&](int64_t n) {
    std::string r;
    for (int64_t k = 0; k < n; ++k) r += fills;
    return r;
  };
  if (align == '<') return full + rep(padn);
  if (align == '>') return rep(padn) + full;
  if (align == '^') return rep(padn / 2) + full + rep(padn - padn / 2);
  if (align == '=' && numeric) return signstr + rep(padn) + body;
  return rep(padn) + full;
}

std::string py_str_format(Interp& in, const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  size_t i = 0, n = fmt.size();
  while (i < n) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < n && fmt[i + 1] == '{') {
        out += '{';
        i += 2;
        continue;
      }
      size_t j = i + 1;
      int depth = 1;
      while (j < n && depth) {
        if (fmt[j] == '{') ++depth;
        else if (fmt[j] == '}') --depth;
        if (depth) ++j;
      }
      if (j >= n) py_raise("ValueError", "Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, j - i - 1);
      i = j + 1;
      std::string spec, conv;
      size_t colon = field.find(':');
      if (colon != std::string::npos) {
        spec = field.substr(colon + 1);
        field = field.substr(0, colon);
      }
      size_t bang = field.find('!');
      if (bang != std::string::npos) {
        conv = field.substr(bang + 1);
        field = field.substr(0, bang);
      }
      size_t k = 0;
      while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
      std::string head = field.substr(0, k);
      Value v;
      if (head.empty()) {
        if (auto_idx >= a.pos.size()) py_raise("IndexError", "Replacement index " + std::to_string(auto_idx) + " out of range for positional args tuple");
        v = a.pos[auto_idx++];
      } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        size_t idx = std::stoul(head);
        if (idx >= a.pos.size()) py_raise("IndexError", "Replacement index " + head + " out of range for positional args tuple");
        v = a.pos[idx];
      } else {
        bool found = false;
        for (auto& kv : a.kw)
          if (kv.first == head) {
            v = kv.second;
            found = true;
          }
        if (!found) py_raise("KeyError", repr_str(head));
      }
      while (k < field.size()) {
        if (field[k] == '.') {
          size_t e = k + 1;
          while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
          v = in.getattr(v, field.substr(k + 1, e - k - 1));
          k = e;
        } else {
          size_t e = field.find(']', k);
          if (e == std::string::npos) py_raise("ValueError", "Missing ']' in format string");
          std::string key = field.substr(k + 1, e - k - 1);
          bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
          v = in.getitem(v, digits ? Value::integer(std::stoll(key)) : Value::string(key));
          k = e + 1;
        }
      }
      if (conv == "r" || conv == "a") v = Value::string(repr(v));
      else if (conv == "s") v = Value::string(to_str(v));
      else if (!conv.empty()) py_raise("ValueError", "Unknown conversion specifier " + conv);
      out += format_spec(v, spec);
      continue;
    }
    if (c == '}') {
      if (i + 1 < n && fmt[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      py_raise("ValueError", "Single '}' encountered in format string");
    }
    out += c;
    ++i;
  }
  return out;
}

// ---- tables -------------------------------------------------------------------------------

const std::unordered_map<std::string_view, FilterFn>& filter_table() {
  static const std::unordered_map<std::string_view, FilterFn> t = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_forceescape},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return t;
}

const std::unordered_map<std::string_view, TestFn>& test_table() {
  static const std::unordered_map<std::string_view, TestFn> t = {
      {"boolean", t_boolean},   {"callable", t_callable}, {"defined", t_defined},   {"divisibleby", t_divisibleby},
      {"escaped", t_escaped},   {"eq", t_eq},             {"equalto", t_eq},        {"==", t_eq},
      {"even", t_even},         {"false", t_false},       {"filter", t_filter},     {"float", t_float},
      {"ge", t_ge},             {">=", t_ge},             {"gt", t_gt},             {">", t_gt},
      {"greaterthan", t_gt},    {"in", t_in},             {"integer", t_integer},   {"iterable", t_iterable},
      {"le", t_le},             {"<=", t_le},             {"lower", t_lower},       {"lt", t_lt},
      {"<", t_lt},              {"lessthan", t_lt},       {"mapping", t_mapping},   {"ne", t_ne},
      {"!=", t_ne},             {"none", t_none},         {"number", t_number},     {"odd", t_odd},
      {"sameas", t_sameas},     {"sequence", t_sequence}, {"string", t_string},     {"test", t_test},
      {"true", t_true},         {"undefined", t_undefined}, {"upper", t_upper},
  };
  return t;
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  auto& t = filter_table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  auto& t = test_table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

bool is_unsupported_filter(std::string_view name) {
  static const char* names[] = {"filesizeformat", "groupby", "pprint",  "random",   "slice",
                                "striptags",      "urlencode", "urlize", "wordwrap", "xmlattr"};
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

bool is_unsupported_test(std::string_view) { return false; }

Value global_function(const std::string& name) {
  static const std::unordered_map<std::string, Value (*)(Interp&, CallArgs&)> t = {
      {"range", g_range},
      {"dict", g_dict},
      {"namespace", g_namespace},
      {"raise_exception", g_raise_exception},
      {"strftime_now", g_strftime_now},
      {"joiner", g_joiner},
  };
  auto it = t.find(name);
  if (it == t.end()) return Value();
  auto f = std::make_shared<BuiltinFn>();
  f->name = name;
  f->fn = it->second;
  return Value::object(std::move(f));
}

// ---- methods ------------------------------------------------------------------------------

namespace {
const char* const kStrMethods[] = {
    "startswith", "endswith",   "split",     "rsplit",    "strip",    "lstrip",      "rstrip",    "replace",
    "upper",      "lower",      "title",     "capitalize", "swapcase", "casefold",   "find",      "rfind",
    "index",      "rindex",     "count",     "join",      "splitlines", "isdigit",   "isalpha",   "isalnum",
    "isspace",    "isupper",    "islower",   "isnumeric", "isdecimal", "istitle",    "zfill",     "center",
    "ljust",      "rjust",      "removeprefix", "removesuffix", "partition", "rpartition", "format", "format_map",
    "encode",     "expandtabs", "isidentifier", "isprintable", "isascii", "maketrans", "translate"};
const char* const kDictMethods[] = {"get", "items", "keys", "values", "copy"};
const char* const kDictUnsafe[] = {"update", "pop", "popitem", "setdefault", "clear", "fromkeys"};
const char* const kListMethods[] = {"index", "count", "copy"};
const char* const kListUnsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};

template <size_t N>
bool in_list(const char* const (&arr)[N], const std::string& name) {
  for (const char* s : arr)
    if (name == s) return true;
  return false;
}
}  // namespace

bool is_method_of(const Value& v, const std::string& name) {
  if (v.is_string()) return in_list(kStrMethods, name);
  if (v.is_dict()) return in_list(kDictMethods, name);
  if (v.is_seq()) return in_list(kListMethods, name);
  return false;
}

bool is_unsafe_method_of(const Value& v, const std::string& name) {
  if (v.is_dict()) return in_list(kDictUnsafe, name);
  if (v.is_list()) return in_list(kListUnsafe, name);
  return false;
}

std::string BoundMethod::repr() const {
  return "<built-in method " + name + " of " + tpl::type_name(self) + " object>";
}

Value call_method(Interp& in, const Value& self, const std::string& name, CallArgs& a) {
  if (LoopObj* loop = self.as<LoopObj>()) {
    if (name == "cycle") {
      if (a.pos.empty()) py_raise("TypeError", "no items for cycling given");
      return a.pos[loop->index0 % a.pos.size()];
    }
    List vals = a.pos;
    Value cur = Value::make_list(std::move(vals));
    if (!loop->has_changed || !equals(loop->last_changed, cur)) {
      loop->has_changed = true;
      loop->last_changed = cur;
      return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (self.is_float() && name == "is_integer") {
    bind("is_integer", a, {});
    return Value::boolean(std::isfinite(self.f) && std::floor(self.f) == self.f);
  }
  if (self.is_dict()) {
    const Dict& d = *self.dict;
    if (name == "get") {
      auto p = bind("get", a, {"key", "default"});
      if (!p[0]) py_raise("TypeError", "get expected at least 1 argument, got 0");
      if (p[0]->is_string())
        if (const Value* v = d.find(p[0]->s)) return *v;
      check_hashable(*p[0]);
      return arg(p[1], Value::none());
    }
    bind(name.c_str(), a, {});
    if (name == "items") {
      List out;
      for (const auto& kv : d.items) out.push_back(Value::make_list({Value::string(kv.first), kv.second}, true));
      return make_view("dict_items", std::move(out));
    }
    if (name == "keys") {
      List out;
      for (const auto& kv : d.items) out.push_back(Value::string(kv.first));
      return make_view("dict_keys", std::move(out));
    }
    if (name == "values") {
      List out;
      for (const auto& kv : d.items) out.push_back(kv.second);
      return make_view("dict_values", std::move(out));
    }
    if (name == "copy") return self;
  }
  if (self.is_seq()) {
    const List& l = *self.list;
    if (name == "count") {
      Value x = one_arg("count", a, "value");
      int64_t n = 0;
      for (const Value& y : l)
        if (equals(x, y)) ++n;
      return Value::integer(n);
    }
    if (name == "index") {
      auto p = bind("index", a, {"value", "start", "stop"});
      if (!p[0]) py_raise("TypeError", "index expected at least 1 argument, got 0");
      int64_t b, e;
      clamp_range(p[1], p[2], static_cast<int64_t>(l.size()), b, e);
      for (int64_t k = b; k < e; ++k)
        if (equals(l[static_cast<size_t>(k)], *p[0])) return Value::integer(k);
      py_raise("ValueError", self.is_tuple() ? "tuple.index(x): x not in tuple" : repr(*p[0]) + " is not in list");
    }
    if (name == "copy") {
      bind("copy", a, {});
      return self;
    }
  }
  if (self.is_string()) {
    const std::string& s = self.s;
    bool mk = self.flag;
    auto str = [&](std::string r) { return Value::string(std::move(r), mk); };
    if (name == "startswith" || name == "endswith") {
      auto p = bind(name.c_str(), a, {"prefix", "start", "end"});
      if (!p[0]) py_raise("TypeError", name + "() takes at least 1 argument (0 given)");
      return Value::boolean(py_affix(s, *p[0], p[1], p[2], name == "endswith"));
    }
    if (name == "split" || name == "rsplit") {
      auto p = bind(name.c_str(), a, {"sep", "maxsplit"});
      int64_t maxsplit = need_int(arg(p[1], Value::integer(-1)), "maxsplit");
      List parts = name == "split" ? py_split(s, arg(p[0], Value::none()), maxsplit)
                                   : py_rsplit(s, arg(p[0], Value::none()), maxsplit);
      if (mk)
        for (auto& x : parts) x.flag = true;
      return Value::make_list(std::move(parts));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      auto p = bind(name.c_str(), a, {"chars"});
      return str(py_strip(s, arg(p[0], Value::none()), name != "rstrip", name != "lstrip"));
    }
    if (name == "replace") {
      auto p = bind("replace", a, {"old", "new", "count"});
      if (!p[0] || !p[1]) py_raise("TypeError", "replace expected at least 2 arguments");
      std::string o = need_str(*p[0], "replace() argument 1"), nw = need_str(*p[1], "replace() argument 2");
      if (mk) {
        if (!p[0]->flag) o = escape_html(o);
        if (!p[1]->flag) nw = escape_html(nw);
      }
      return str(py_replace(s, o, nw, need_int(arg(p[2], Value::integer(-1)), "count")));
    }
    if (name == "upper") return bind("upper", a, {}), str(uni::upper(s));
    if (name == "lower" || name == "casefold") return bind(name.c_str(), a, {}), str(uni::lower(s));
    if (name == "title") return bind("title", a, {}), str(uni::title(s));
    if (name == "capitalize") return bind("capitalize", a, {}), str(uni::capitalize(s));
    if (name == "swapcase") return bind("swapcase", a, {}), str(uni::swapcase(s));
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
      auto p = bind(name.c_str(), a, {"sub", "start", "end"});
      if (!p[0]) py_raise("TypeError", name + "() takes at least 1 argument (0 given)");
      int64_t r = py_find(s, need_str(*p[0], "must be str"), p[1], p[2], name[0] == 'r');
      if (r < 0 && (name == "index" || name == "rindex")) py_raise("ValueError", "substring not found");
      return Value::integer(r);
    }
    if (name == "count") {
      auto p = bind("count", a, {"sub", "start", "end"});
      if (!p[0]) py_raise("TypeError", "count() takes at least 1 argument (0 given)");
      return Value::integer(py_count(s, need_str(*p[0], "must be str"), p[1], p[2]));
    }
    if (name == "join") {
      Value it = one_arg("join", a, "iterable");
      List xs = iterate(it);
      std::string out;
      for (size_t k = 0; k < xs.size(); ++k) {
        if (!xs[k].is_string())
          py_raise("TypeError", "sequence item " + std::to_string(k) + ": expected str instance, " + type_name(xs[k]) + " found");
        if (k) out += s;
        out += mk && !xs[k].flag ? escape_html(xs[k].s) : xs[k].s;
      }
      return str(std::move(out));
    }
    if (name == "splitlines") {
      auto p = bind("splitlines", a, {"keepends"});
      List parts = py_splitlines(s, truthy(arg(p[0], Value::boolean(false))));
      if (mk)
        for (auto& x : parts) x.flag = true;
      return Value::make_list(std::move(parts));
    }
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") {
      bind(name.c_str(), a, {});
      return Value::boolean(all_chars(s, name == "isdigit" ? uni::is_digit
                                         : name == "isnumeric" ? uni::is_numeric : uni::is_decimal));
    }
    if (name == "isalpha") return bind("isalpha", a, {}), Value::boolean(all_chars(s, uni::is_alpha));
    if (name == "isalnum") return bind("isalnum", a, {}), Value::boolean(all_chars(s, uni::is_alnum));
    if (name == "isspace") return bind("isspace", a, {}), Value::boolean(all_chars(s, uni::is_space));
    if (name == "isascii") return bind("isascii", a, {}), Value::boolean(uni::is_ascii(s));
    if (name == "isprintable") {
      bind("isprintable", a, {});
      for (char32_t c : uni::decode(s))
        if (!uni::is_printable(c)) return Value::boolean(false);
      return Value::boolean(true);
    }
    if (name == "isupper" || name == "islower") {
      bind(name.c_str(), a, {});
      CallArgs none;
      return Value::boolean(name == "isupper" ? t_upper(in, self, none) : t_lower(in, self, none));
    }
    if (name == "istitle") {
      bind("istitle", a, {});
      bool prev_cased = false, any = false;
      for (char32_t c : uni::decode(s)) {
        if (uni::is_upper(c) || uni::is_title(c)) {
          if (prev_cased) return Value::boolean(false);
          prev_cased = true;
          any = true;
        } else if (uni::is_lower(c)) {
          if (!prev_cased) return Value::boolean(false);
          prev_cased = true;
          any = true;
        } else {
          prev_cased = false;
        }
      }
      return Value::boolean(any);
    }
    if (name == "isidentifier") {
      bind("isidentifier", a, {});
      U32 u = uni::decode(s);
      if (u.empty() || (u[0] >= '0' && u[0] <= '9')) return Value::boolean(false);
      for (char32_t c : u)
        if (!uni::is_word(c)) return Value::boolean(false);
      return Value::boolean(true);
    }
    if (name == "zfill") {
      int64_t w = need_int(one_arg("zfill", a, "width"), "width");
      U32 u = uni::decode(s);
      if (static_cast<int64_t>(u.size()) >= w) return str(s);
      size_t fill = static_cast<size_t>(w) - u.size();
      U32 out;
      size_t start = 0;
      if (!u.empty() && (u[0] == '+' || u[0] == '-')) {
        out.push_back(u[0]);
        start = 1;
      }
      out.append(fill, U'0');
      out.append(u.substr(start));
      return str(uni::encode(out));
    }
    if (name == "center" || name == "ljust" || name == "rjust") {
      auto p = bind(name.c_str(), a, {"width", "fillchar"});
      if (!p[0]) py_raise("TypeError", name + "() takes at least 1 argument (0 given)");
      std::string fill = p[1] ? need_str(*p[1], "fillchar") : " ";
      if (uni::length(fill) != 1) py_raise("TypeError", "The fill character must be exactly one character long");
      return str(py_pad(s, need_int(*p[0], "width"), fill, name == "center" ? 0 : name == "ljust" ? 1 : 2));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      std::string x = need_str(one_arg(name.c_str(), a, "affix"), name.c_str());
      if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return str(s.substr(x.size()));
      if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
          s.compare(s.size() - x.size(), x.size(), x) == 0)
        return str(s.substr(0, s.size() - x.size()));
      return str(s);
    }
    if (name == "partition" || name == "rpartition") {
      std::string sep = need_str(one_arg(name.c_str(), a, "sep"), "sep");
      if (sep.empty()) py_raise("ValueError", "empty separator");
      size_t f = name == "partition" ? s.find(sep) : s.rfind(sep);
      if (f == std::string::npos) {
        if (name == "partition") return Value::make_list({str(s), str(""), str("")}, true);
        return Value::make_list({str(""), str(""), str(s)}, true);
      }
      return Value::make_list({str(s.substr(0, f)), str(sep), str(s.substr(f + sep.size()))}, true);
    }
    if (name == "format") return str(py_str_format(in, s, a));
    if (name == "format_map") {
      Value m = one_arg("format_map", a, "mapping");
      if (!m.is_dict()) py_raise("TypeError", "format_map argument must be a mapping");
      CallArgs c;
      for (const auto& kv : m.dict->items) c.kw.emplace_back(kv.first, kv.second);
      return str(py_str_format(in, s, c));
    }
    py_raise("TemplateRuntimeError", "unsupported construct: str." + name + "()");
  }
  py_raise("TemplateRuntimeError", "unsupported construct: method '" + name + "' of " + type_name(self));
}

// ---- printf-style formatting (str % args) -------------------------------------------------

std::string py_percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> items;
  const Dict* mapping = nullptr;
  if (args.is_tuple()) {
    items = *args.list;
  } else {
    if (args.is_dict()) mapping = args.dict.get();
    items.push_back(args);
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  size_t i = 0, n = fmt.size();
  auto take = [&]() -> Value {
    if (next >= items.size()) py_raise("TypeError", "not enough arguments for format string");
    return items[next++];
  };
  while (i < n) {
    char c = fmt[i];
    if (c != '%') {
      out += c;
      ++i;
      continue;
    }
    ++i;
    if (i >= n) py_raise("ValueError", "incomplete format");
    Value v;
    bool have_v = false;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos) py_raise("ValueError", "incomplete format key");
      if (!mapping) py_raise("TypeError", "format requires a mapping");
      std::string key = fmt.substr(i + 1, e - i - 1);
      const Value* p = mapping->find(key);
      if (!p) py_raise("KeyError", repr_str(key));
      v = *p;
      have_v = true;
      used_mapping = true;
      i = e + 1;
    }
    std::string flags;
    while (i < n && std::strchr("-+ #0", fmt[i])) flags += fmt[i++];
    std::string width;
    if (i < n && fmt[i] == '*') {
      width = std::to_string(need_int(take(), "width"));
      ++i;
    } else {
      while (i < n && std::isdigit(static_cast<unsigned char>(fmt[i]))) width += fmt[i++];
    }
    std::string prec;
    bool has_prec = false;
    if (i < n && fmt[i] == '.') {
      has_prec = true;
      ++i;
      if (i < n && fmt[i] == '*') {
        prec = std::to_string(need_int(take(), "precision"));
        ++i;
      } else {
        while (i < n && std::isdigit(static_cast<unsigned char>(fmt[i]))) prec += fmt[i++];
      }
    }
    while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= n) py_raise("ValueError", "incomplete format");
    char conv = fmt[i++];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!have_v) v = take();
    std::string body;
    char buf[512];
    std::string spec = "%" + flags + width + (has_prec ? "." + (prec.empty() ? "0" : prec) : "");
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? to_str(v) : repr(v);
        if (has_prec) s = uni::encode(U32(uni::decode(s).substr(0, static_cast<size_t>(std::stoll(prec.empty() ? "0" : prec)))));
        int64_t w = width.empty() ? 0 : std::stoll(width);
        int64_t len = static_cast<int64_t>(uni::length(s));
        if (len < w) {
          if (flags.find('-') != std::string::npos)
            s += std::string(static_cast<size_t>(w - len), ' ');
          else
            s = std::string(static_cast<size_t>(w - len), ' ') + s;
        }
        out += s;
        continue;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number())
          py_raise("TypeError", std::string("%") + conv + " format: " +
                                    (conv == 'x' || conv == 'X' || conv == 'o' ? "an integer" : "a real number") +
                                    " is required, not " + type_name(v));
        if (v.is_float() && (conv == 'x' || conv == 'X' || conv == 'o'))
          py_raise("TypeError", std::string("%") + conv + " format: an integer is required, not float");
        int64_t x = v.is_float() ? static_cast<int64_t>(std::trunc(v.f)) : v.as_int();
        char cc = conv == 'i' || conv == 'u' ? 'd' : conv;
        std::string f = spec + "ll" + cc;
        if (cc != 'd' && x < 0) {
          std::string f2 = "%" + std::string("ll") + cc;
          std::snprintf(buf, sizeof(buf), f2.c_str(), static_cast<long long>(-x));
          body = std::string("-") + (flags.find('#') != std::string::npos ? (cc == 'o' ? "0o" : cc == 'x' ? "0x" : "0X") : "") + buf;
          int64_t w = width.empty() ? 0 : std::stoll(width);
          while (static_cast<int64_t>(body.size()) < w) body = (flags.find('-') != std::string::npos) ? body + " " : " " + body;
          out += body;
          continue;
        }
        std::snprintf(buf, sizeof(buf), f.c_str(), static_cast<long long>(x));
        body = buf;
        if (cc == 'o' && flags.find('#') != std::string::npos) {
          size_t z = body.find_first_of("0123456789");
          if (z != std::string::npos && body.compare(z, 1, "0") == 0 && x != 0) body.insert(z + 1, "o");
        }
        out += body;
        continue;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) py_raise("TypeError", "must be real number, not " + type_name(v));
        std::string f = spec + conv;
        std::snprintf(buf, sizeof(buf), f.c_str(), v.as_double());
        out += buf;
        continue;
      }
      case 'c': {
        if (v.is_string() && uni::length(v.s) == 1) {
          out += v.s;
        } else if (v.is_intlike()) {
          uni::append_utf8(out, static_cast<char32_t>(v.as_int()));
        } else {
          py_raise("TypeError", "%c requires int or char");
        }
        continue;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "%x", static_cast<unsigned char>(conv));
        py_raise("ValueError", std::string("unsupported format character '") + conv + "' (0x" + hex + ") at index " +
                                   std::to_string(i - 1));
      }
    }
  }
  if (!used_mapping && !mapping && !args.is_list() && !args.is_undefined() && next < items.size())
    py_raise("TypeError", "not all arguments converted during string formatting");
  return out;
}

}  // namespace bonsai::tpl
