#include "tests/test_util.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backends/registry.h"
#include "engine/core/errors.h"
#include "engine/core/file_io.h"

namespace tmx::test {

uint64_t fresh_seed() {
    if (const char* s = std::getenv("TMX_TEST_SEED")) return std::strtoull(s, nullptr, 10);
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<uint64_t>(::getpid()) << 32);
}

TrainOptions small_train_options(const std::string& data, uint64_t seed) {
    TrainOptions o;
    o.data_dir = data;
    o.batch_size = 4;
    o.seq_len = 16;
    o.max_steps = 30;
    o.lr = 1e-2;
    o.min_lr = 1e-3;
    o.warmup_steps = 5;
    o.eval_every = 0;
    o.eval_batches = 2;
    o.checkpoint_every = 0;
    o.log_every = 1;
    o.seed = seed;
    return o;
}

std::vector<float> random_normal(Rng& rng, size_t n, double scale) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
    return v;
}

std::vector<int32_t> random_ints(Rng& rng, size_t n, int32_t lo, int32_t hi) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = lo + static_cast<int32_t>(rng.below(static_cast<uint64_t>(hi - lo)));
    return v;
}

bool backend_required(const std::string& name) {
    const char* list = std::getenv("TMX_REQUIRE_BACKENDS");
    if (!list) return false;
    const std::string base = name.substr(0, name.find(':'));
    std::stringstream ss(list);
    for (std::string item; std::getline(ss, item, ',');)
        if (item == base) return true;
    return false;
}

bool backend_opens(const std::string& name) {
    try {
        make_backend(name);
        return true;
    } catch (const std::exception& e) {
        EXPECT_FALSE(backend_required(name)) << name << ": " << e.what();
        return false;
    }
}

TempDir::TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tmx-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

namespace {
std::optional<std::string> env(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
}
void restore_env(const char* name, const std::optional<std::string>& value) {
    if (value)
        setenv(name, value->c_str(), 1);
    else
        unsetenv(name);
}
}  // namespace

CacheHome::CacheHome() : old_xdg_(env("XDG_CACHE_HOME")), old_mesa_(env("MESA_SHADER_CACHE_DIR")) {
    // Mesa's own rule: $MESA_SHADER_CACHE_DIR, else $XDG_CACHE_HOME (when absolute), else
    // $HOME/.cache; it keeps its files in mesa_shader_cache under that directory.
    if (!old_mesa_) {
        std::string base;
        if (old_xdg_ && !old_xdg_->empty() && old_xdg_->front() == '/')
            base = *old_xdg_;
        else if (const auto home = env("HOME"); home && !home->empty())
            base = *home + "/.cache";
        if (!base.empty()) setenv("MESA_SHADER_CACHE_DIR", base.c_str(), 1);
    }
    setenv("XDG_CACHE_HOME", dir_.path().c_str(), 1);
}

CacheHome::~CacheHome() {
    restore_env("XDG_CACHE_HOME", old_xdg_);
    restore_env("MESA_SHADER_CACHE_DIR", old_mesa_);
}

namespace {
std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}
}  // namespace

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::string synthetic_stories(Rng& rng, int documents) {
    const char* words[] = {"once", "upon",  "a",  "time", "there", "was", "little", "fox",
                           "who",  "liked", "to", "run",  "in",    "the", "green",  "woods"};
    std::string text;
    for (int doc = 0; doc < documents; ++doc) {
        for (int w = 0; w < 10; ++w) text += std::string(words[rng.below(16)]) + " ";
        text += "é 日本\n\n";
    }
    return text;
}

std::string make_cli_checkpoint(const TempDir& dir, Rng& rng, const std::string& overrides,
                                uint64_t seed) {
    write_file_atomic(dir / "corpus.txt", synthetic_stories(rng, 300));
    auto r = run_tmx("tokenizer train --input " + dir / "corpus.txt" + " --vocab-size 300 --out " +
                     dir / "tok.model");
    if (r.exit_code != 0) {
        ADD_FAILURE() << r.err;
        return "";
    }
    nlohmann::json cfg = read_json_file(source_dir() + "/assets/configs/test-tiny-swiglu.json");
    cfg["vocab_size"] = 300;
    cfg.update(nlohmann::json::parse(overrides));
    write_file_atomic(dir / "cfg.json", cfg.dump());
    r = run_tmx("init --config " + dir / "cfg.json" + " --tokenizer " + dir / "tok.model" +
                " --out " + dir / "ckpt" + " --seed " + std::to_string(seed));
    if (r.exit_code != 0) {
        ADD_FAILURE() << r.err;
        return "";
    }
    return dir / "ckpt";
}

CommandResult run_tmx(const std::string& args) {
    TempDir dir;
    std::string out = dir / "out", err = dir / "err";
    std::string cmd =
        std::string(TMX_BINARY) + " " + args + " >" + out + " 2>" + err + " </dev/null";
    int status = std::system(cmd.c_str());
    CommandResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

std::string flat(const std::string& text) {
    std::string out;
    for (char c : text) {
        const bool space = c == ' ' || c == '\n';
        if (!space || (!out.empty() && out.back() != ' ')) out.push_back(space ? ' ' : c);
    }
    return out;
}

std::string source_dir() {
    return TMX_SOURCE_DIR;
}

std::string shared_dir() {
    auto p = std::filesystem::path(TMX_SOURCE_DIR) / ".." / "shared";
    return std::filesystem::exists(p / "DESIGN.md") ? p.lexically_normal().string() : "";
}

std::vector<int32_t> read_token_file(const std::string& path) {
    std::vector<int32_t> tokens;
    const std::string text = slurp(path);
    size_t i = 0;
    while (i < text.size()) {
        size_t j = text.find_first_of(",\n", i);
        if (j == std::string::npos) j = text.size();
        if (j > i) tokens.push_back(std::stoi(text.substr(i, j - i)));
        i = j + 1;
    }
    return tokens;
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

}  // namespace tmx::test
