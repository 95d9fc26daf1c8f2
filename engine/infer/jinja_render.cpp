// The Jinja subset's interpreter (jinja.h): walks the syntax tree with Jinja2's scoping (a for
// loop's body starts each iteration in a fresh scope over the enclosing one; if-blocks share
// their scope; a macro sees the template's top level), Python's operators, and the limits on
// the work and output of one render.
#include <cmath>

#include "engine/infer/jinja_detail.h"

namespace tmx::jinja::detail {
namespace {

using T = Value::Type;

struct Scope {
    Scope* parent = nullptr;
    std::vector<std::pair<std::string, Value>> vars;

    const Value* find(std::string_view name) const {
        for (const Scope* s = this; s; s = s->parent)
            for (const auto& [k, v] : s->vars)
                if (k == name) return &v;
        return nullptr;
    }
    void set(const std::string& name, Value v) {
        for (auto& [k, old] : vars)
            if (k == name) {
                old = std::move(v);
                return;
            }
        vars.emplace_back(name, std::move(v));
    }
};

[[noreturn]] void overflow() {
    fail("integer overflow (the subset's integers are 64-bit)");
}

int64_t as_int(const Value& v) {
    return v.is(T::Int) ? v.integer : int64_t{v.boolean};
}
double as_double(const Value& v) {
    return v.is(T::Float) ? v.number : v.is(T::Int) ? static_cast<double>(v.integer) : v.boolean;
}

// Python's binary arithmetic on the subset's values; Undefined operands fail with their own
// message, as Jinja's Undefined does.
Value arithmetic(const std::string& op, const Value& a, const Value& b, Budget& budget) {
    if (a.is(T::Undefined)) fail(a.text);
    if (b.is(T::Undefined)) fail(b.text);
    const auto unsupported = [&]() -> Value {
        fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
             type_name(b) + "'");
    };
    if (a.is_number() && b.is_number()) {
        const bool ints = !a.is(T::Float) && !b.is(T::Float);
        const int64_t x = as_int(a), y = as_int(b);
        const double dx = as_double(a), dy = as_double(b);
        int64_t r = 0;
        if (op == "+") {
            if (!ints) return Value::of(dx + dy);
            if (__builtin_add_overflow(x, y, &r)) overflow();
            return Value::of(r);
        }
        if (op == "-") {
            if (!ints) return Value::of(dx - dy);
            if (__builtin_sub_overflow(x, y, &r)) overflow();
            return Value::of(r);
        }
        if (op == "*") {
            if (!ints) return Value::of(dx * dy);
            if (__builtin_mul_overflow(x, y, &r)) overflow();
            return Value::of(r);
        }
        if (op == "/") {
            if (dy == 0) fail("division by zero");
            return Value::of(dx / dy);
        }
        if (op == "//" || op == "%") {
            if (ints) {
                if (y == 0) fail("integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) overflow();
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // floor, as Python
                return Value::of(op == "//" ? q : m);
            }
            if (dy == 0) fail(op == "//" ? "float floor division by zero" : "float modulo");
            double m = std::fmod(dx, dy);
            if (m != 0 && ((m < 0) != (dy < 0))) m += dy;
            return Value::of(op == "//" ? std::floor((dx - m) / dy) : m);
        }
        if (op == "**") {
            if (ints && y >= 0) {
                int64_t result = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) overflow();
                }
                return Value::of(result);
            }
            if (dx == 0 && dy < 0) fail("0.0 cannot be raised to a negative power");
            if (dx < 0 && dy != std::floor(dy)) fail("a negative number to a fractional power");
            const double r = std::pow(dx, dy);
            if (std::isinf(r)) fail("numerical result out of range");
            return Value::of(r);
        }
        return unsupported();
    }
    if (op == "+" && a.is(T::String) && b.is(T::String)) {
        budget.built(a.text.size() + b.text.size());
        return Value::of(a.text + b.text);
    }
    if (op == "+" && a.is(T::List) && b.is(T::List)) {
        std::vector<Value> items = a.list->items;
        items.insert(items.end(), b.list->items.begin(), b.list->items.end());
        budget.built(8 * items.size());
        return Value::of_list(std::move(items));
    }
    if (op == "*" && (a.is(T::String) || b.is(T::String)) && (a.is(T::Int) || b.is(T::Int))) {
        const std::string& s = a.is(T::String) ? a.text : b.text;
        const int64_t n = a.is(T::Int) ? a.integer : b.integer;
        if (n <= 0 || s.empty()) return Value::of(std::string());
        if (static_cast<uint64_t>(n) > budget.limits().max_output_bytes / s.size())
            fail("a repeated string over " + std::to_string(budget.limits().max_output_bytes) +
                 " bytes (limit)");
        budget.built(static_cast<size_t>(n) * s.size());
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += s;
        return Value::of(std::move(out));
    }
    if (op == "%" && a.is(T::String)) fail("string formatting with % is not supported");
    return unsupported();
}

class Renderer {
  public:
    Renderer(const Template::Impl& t) : limits_(t.limits), budget_(limits_) {}

    std::string run(const Body& body, const nlohmann::ordered_json& vars) {
        if (!vars.is_object()) fail("the template's variables must be a JSON object");
        for (const auto& [name, value] : vars.items()) root_.set(name, from_json(value));
        std::string out;
        exec(body, root_, out);
        return out;
    }
    int line() const { return line_; }

  private:
    enum class Flow { Normal, Break, Continue };

    void append(std::string& out, const std::string& s) {
        if (out.size() + s.size() > limits_.max_output_bytes)
            fail("the output is over " + std::to_string(limits_.max_output_bytes) +
                 " bytes (limit)");
        budget_.built(s.size());
        out += s;
    }

    Flow exec(const Body& body, Scope& scope, std::string& out) {
        for (const auto& n : body)
            if (const Flow f = exec(*n, scope, out); f != Flow::Normal) return f;
        return Flow::Normal;
    }

    Flow exec(const Node& n, Scope& scope, std::string& out) {
        budget_.step();
        line_ = n.line;
        switch (n.kind) {
            case Node::Kind::Text:
                append(out, n.text);
                break;
            case Node::Kind::Output:
                append(out, to_str(eval(*n.expr, scope)));
                break;
            case Node::Kind::If:
                for (size_t i = 0; i < n.conds.size(); ++i)
                    if (truthy(eval(*n.conds[i], scope))) return exec(n.bodies[i], scope, out);
                if (n.bodies.size() > n.conds.size()) return exec(n.bodies.back(), scope, out);
                break;
            case Node::Kind::For:
                exec_for(n, scope, out);
                break;
            case Node::Kind::Set:
                bind(n.targets, eval(*n.expr, scope), scope);
                break;
            case Node::Kind::SetAttr: {
                const Value* ns = scope.find(n.targets[0]);
                if (!ns || !ns->is(T::Namespace))
                    fail("cannot assign the attribute '" + n.attr + "' of '" + n.targets[0] +
                         "': it is not a namespace()");
                Value v = eval(*n.expr, scope);
                if (v.is(T::Namespace)) fail("a namespace cannot be put in a namespace");
                const std::shared_ptr<DictData> data = ns->ns;
                bool replaced = false;
                for (auto& [k, old] : data->items)
                    if (k == n.attr) old = v, replaced = true;
                if (!replaced) data->items.emplace_back(n.attr, std::move(v));
                break;
            }
            case Node::Kind::SetBlock: {
                std::string text;
                const Flow f = exec(n.bodies[0], scope, text);
                scope.set(n.targets[0], Value::of(std::move(text)));
                return f;
            }
            case Node::Kind::Macro: {
                Value fn;
                fn.type = T::Function;
                fn.function = std::make_shared<Callable>(Callable{n.text, &n});
                scope.set(n.text, std::move(fn));
                break;
            }
            case Node::Kind::Break:
                return Flow::Break;
            case Node::Kind::Continue:
                return Flow::Continue;
            case Node::Kind::Generation:
                return exec(n.bodies[0], scope, out);
        }
        return Flow::Normal;
    }

    // Binds one name, or unpacks a list (or string) into several.
    static void bind(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
        if (targets.size() == 1) return scope.set(targets[0], v);
        if (!v.is(T::List) && !v.is(T::String))
            fail("cannot unpack non-iterable " + type_name(v) + " object");
        std::vector<Value> items;
        if (v.is(T::List)) {
            items = v.list->items;
        } else {
            for (const char32_t c : decode(v.text)) items.push_back(Value::of(encode({&c, 1})));
        }
        if (items.size() != targets.size())
            fail(std::string(items.size() > targets.size() ? "too many" : "not enough") +
                 " values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                 std::to_string(items.size()) + ")");
        for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], items[i]);
    }

    void exec_for(const Node& n, Scope& scope, std::string& out) {
        const Value iterable = eval(*n.expr, scope);
        std::vector<Value> all;
        switch (iterable.type) {
            case T::List:
                all = iterable.list->items;
                break;
            case T::Dict:
                for (const auto& [k, v] : iterable.dict->items) all.push_back(Value::of(k));
                break;
            case T::String:
                for (const char32_t c : decode(iterable.text))
                    all.push_back(Value::of(encode({&c, 1})));
                break;
            case T::Undefined:
                break;
            default:
                fail("'" + type_name(iterable) + "' object is not iterable");
        }
        std::vector<Value> items;
        for (Value& item : all) {
            if (n.filter) {
                budget_.step();
                Scope test{&scope, {}};
                bind(n.targets, item, test);
                if (!truthy(eval(*n.filter, test))) continue;
            }
            items.push_back(std::move(item));
        }
        const auto count = static_cast<int64_t>(items.size());
        for (int64_t i = 0; i < count; ++i) {
            budget_.step();
            std::vector<std::pair<std::string, Value>> loop = {
                {"index", Value::of(i + 1)},        {"index0", Value::of(i)},
                {"revindex", Value::of(count - i)}, {"revindex0", Value::of(count - i - 1)},
                {"first", Value::of(i == 0)},       {"last", Value::of(i == count - 1)},
                {"length", Value::of(count)},       {"depth", Value::of(int64_t{1})},
                {"depth0", Value::of(int64_t{0})}};
            if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
            if (i + 1 < count) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
            Scope iteration{&scope, {}};
            iteration.set("loop", Value::of_dict(std::move(loop)));
            bind(n.targets, items[static_cast<size_t>(i)], iteration);
            if (exec(n.bodies[0], iteration, out) == Flow::Break) break;
        }
        if (items.empty() && n.bodies.size() > 1) exec(n.bodies[1], scope, out);
    }

    Args eval_args(const Expr& e, size_t first, Scope& scope) {
        Args args;
        for (size_t i = first; i < e.args.size(); ++i)
            args.positional.push_back(eval(*e.args[i], scope));
        for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, scope));
        return args;
    }

    Value call_macro(const Node& macro, const Args& args) {
        if (call_depth_ >= limits_.max_call_depth)
            fail("macros called more than " + std::to_string(limits_.max_call_depth) +
                 " deep (limit)");
        const std::string what = "the macro '" + macro.text + "'";
        if (args.positional.size() > macro.params.size())
            fail(what + " takes not more than " + std::to_string(macro.params.size()) +
                 " argument(s)");
        struct Depth {  // counts from before the defaults, which may call macros too
            int& depth;
            ~Depth() { --depth; }
        } depth{++call_depth_};
        Scope scope{&root_, {}};
        std::vector<bool> given(macro.params.size());
        for (size_t i = 0; i < args.positional.size(); ++i)
            scope.set(macro.params[i], args.positional[i]), given[i] = true;
        for (const auto& [k, v] : args.keyword) {
            const auto it = std::find(macro.params.begin(), macro.params.end(), k);
            if (it == macro.params.end()) fail(what + " takes no keyword argument '" + k + "'");
            const auto at = static_cast<size_t>(it - macro.params.begin());
            if (given[at]) fail(what + " got multiple values for the argument '" + k + "'");
            scope.set(k, v), given[at] = true;
        }
        for (size_t i = 0; i < macro.params.size(); ++i) {
            if (given[i]) continue;
            scope.set(macro.params[i], macro.defaults[i]
                                           ? eval(*macro.defaults[i], scope)
                                           : Value::undefined("the argument '" + macro.params[i] +
                                                              "' of " + what + " was not given"));
        }
        std::string out;
        exec(macro.bodies[0], scope, out);
        return Value::of(std::move(out));
    }

    Value call(const Expr& e, Scope& scope) {
        Args args = eval_args(e, 0, scope);
        const Value* found = scope.find(e.name);
        if (found && !found->is(T::Function))
            fail("'" + type_name(*found) + "' object is not callable");
        if (found && found->function->macro) {
            const Value fn = *found;  // the scope may change during the call
            return call_macro(*fn.function->macro, args);
        }
        const std::string name = found ? found->function->name : e.name;
        if (!is_global_function(name)) fail("'" + name + "' is undefined");
        if (name == "raise_exception") {
            const auto a = detail::bind(args, {"message"}, "raise_exception()");
            throw Raised{a[0] ? to_str(*a[0]) : std::string()};
        }
        return call_global(name, args, budget_);
    }

    Value slice(const Expr& e, Scope& scope) {
        const Value object = eval(*e.args[0], scope);
        if (object.is(T::Undefined)) fail(object.text);
        std::optional<int64_t> bound[3];
        for (int k = 0; k < 3; ++k) {
            if (!e.args[k + 1]) continue;
            const Value b = eval(*e.args[k + 1], scope);
            if (b.is(T::None)) continue;
            if (!b.is(T::Int) && !b.is(T::Bool))
                return Value::undefined("slice indices must be integers or None");
            bound[k] = as_int(b);
        }
        const int64_t step = bound[2].value_or(1);
        if (step == 0) fail("slice step cannot be zero");
        std::u32string text;
        if (object.is(T::String))
            text = decode(object.text);
        else if (!object.is(T::List))
            return Value::undefined(type_name(object) + " cannot be sliced");
        const auto n =
            static_cast<int64_t>(object.is(T::List) ? object.list->items.size() : text.size());
        // Python's slice.indices(n).
        auto clamp = [&](std::optional<int64_t> b, int64_t fallback) {
            if (!b) return fallback;
            int64_t v = *b < 0 ? *b + n : *b;
            if (v < 0) v = step < 0 ? -1 : 0;
            if (v >= n) v = step < 0 ? n - 1 : n;
            return v;
        };
        const int64_t start = clamp(bound[0], step < 0 ? n - 1 : 0);
        const int64_t stop = clamp(bound[1], step < 0 ? -1 : n);
        std::vector<Value> items;
        std::u32string chars;
        for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
            if (object.is(T::List))
                items.push_back(object.list->items[static_cast<size_t>(i)]);
            else
                chars += text[static_cast<size_t>(i)];
            if (__builtin_add_overflow(i, step, &i)) break;
        }
        budget_.built(8 * items.size() + 4 * chars.size());
        return object.is(T::List) ? Value::of_list(std::move(items)) : Value::of(encode(chars));
    }

    Value eval(const Expr& e, Scope& scope) {
        budget_.step();
        line_ = e.line;
        switch (e.kind) {
            case Expr::Kind::Literal:
                return e.literal;
            case Expr::Kind::Name: {
                if (const Value* v = scope.find(e.name)) return *v;
                if (is_global_function(e.name)) {
                    Value fn;
                    fn.type = T::Function;
                    fn.function = std::make_shared<Callable>(Callable{e.name, nullptr});
                    return fn;
                }
                return Value::undefined("'" + e.name + "' is undefined");
            }
            case Expr::Kind::List:
            case Expr::Kind::Dict: {
                std::vector<Value> items;
                for (const ExprPtr& item : e.args) items.push_back(eval(*item, scope));
                budget_.built(8 * items.size());
                if (e.kind == Expr::Kind::List) return Value::of_list(std::move(items));
                std::vector<std::pair<std::string, Value>> pairs;
                for (size_t i = 0; i + 1 < items.size(); i += 2) {
                    if (!items[i].is(T::String))
                        fail("dict keys must be strings here, not " + type_name(items[i]));
                    pairs.emplace_back(items[i].text, std::move(items[i + 1]));
                }
                return Value::of_dict(std::move(pairs));
            }
            case Expr::Kind::Attr:
                return get_attr(eval(*e.args[0], scope), e.name);
            case Expr::Kind::Item: {
                const Value object = eval(*e.args[0], scope);
                return get_item(object, eval(*e.args[1], scope));
            }
            case Expr::Kind::Slice:
                return slice(e, scope);
            case Expr::Kind::Call:
                return call(e, scope);
            case Expr::Kind::MethodCall: {
                const Value receiver = eval(*e.args[0], scope);
                return call_method(receiver, e.name, eval_args(e, 1, scope), budget_);
            }
            case Expr::Kind::Filter: {
                const Value operand = eval(*e.args[0], scope);
                return apply_filter(e.name, operand, eval_args(e, 1, scope), budget_);
            }
            case Expr::Kind::Test: {
                const Value operand = eval(*e.args[0], scope);
                return Value::of(apply_test(e.name, operand, eval_args(e, 1, scope)) != e.negated);
            }
            case Expr::Kind::Unary: {
                const Value v = eval(*e.args[0], scope);
                if (e.name == "not") return Value::of(!truthy(v));
                if (v.is(T::Undefined)) fail(v.text);
                if (v.is(T::Float)) return Value::of(e.name == "-" ? -v.number : v.number);
                if (!v.is(T::Int) && !v.is(T::Bool))
                    fail("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
                if (e.name == "-" && as_int(v) == INT64_MIN) overflow();
                return Value::of(e.name == "-" ? -as_int(v) : as_int(v));
            }
            case Expr::Kind::Binary: {
                Value a = eval(*e.args[0], scope);
                if (e.name == "and") return truthy(a) ? eval(*e.args[1], scope) : a;
                if (e.name == "or") return truthy(a) ? a : eval(*e.args[1], scope);
                const Value b = eval(*e.args[1], scope);
                if (e.name == "~") {
                    std::string s = to_str(a) + to_str(b);
                    budget_.built(s.size());
                    return Value::of(std::move(s));
                }
                return arithmetic(e.name, a, b, budget_);
            }
            case Expr::Kind::Compare: {
                Value left = eval(*e.args[0], scope);
                for (size_t i = 0; i < e.ops.size(); ++i) {
                    Value right = eval(*e.args[i + 1], scope);
                    const std::string& op = e.ops[i];
                    const bool holds = op == "=="       ? equal(left, right)
                                       : op == "!="     ? !equal(left, right)
                                       : op == "in"     ? contains(right, left)
                                       : op == "not in" ? !contains(right, left)
                                                        : less(left, right, op);
                    if (!holds) return Value::of(false);
                    left = std::move(right);
                }
                return Value::of(true);
            }
            case Expr::Kind::Cond:
                if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
                if (e.args[2]) return eval(*e.args[2], scope);
                return Value::undefined(
                    "the inline if-expression evaluated to false and no else section was "
                    "defined");
        }
        fail("unknown expression");
    }

    const Limits& limits_;
    Budget budget_;
    Scope root_;
    int line_ = 0, call_depth_ = 0;
};

}  // namespace

std::string render_template(const Template::Impl& t, const nlohmann::ordered_json& vars) {
    Renderer renderer(t);
    try {
        return renderer.run(t.body, vars);
    } catch (const Failure& f) {
        throw Error(t.source + ": line " + std::to_string(renderer.line()) + ": " + f.message);
    } catch (const Raised& r) {
        throw TemplateRaised(t.source + ": line " + std::to_string(renderer.line()) +
                                 ": the template raised an exception: " + r.message,
                             r.message);
    }
}

}  // namespace tmx::jinja::detail

namespace tmx::jinja {

Template Template::parse(std::string_view text, const std::string& source, const Limits& limits) {
    auto impl = std::make_shared<Impl>();
    impl->source = source;
    impl->limits = limits;
    try {
        impl->body = detail::parse_template(text, impl->limits);
    } catch (const detail::Failure& f) {
        throw Error(source + ": " + f.message);
    }
    return Template(std::move(impl));
}

std::string Template::render(const nlohmann::ordered_json& vars) const {
    return detail::render_template(*impl_, vars);
}

}  // namespace tmx::jinja
