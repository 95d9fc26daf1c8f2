// `tmx export --format gguf` read by a GGUF reader nobody here wrote: npm's @huggingface/gguf
// (scripts/test.sh installs it into build/npm) through tests/clients/gguf_reader.cjs, which
// checks every tensor at the offsets the reader reports against the checkpoint's weights under
// llama.cpp's layout, the q/k rows in the order of llama.cpp's converter. The round trips of
// interop_cli_test.cpp cannot see that order: the import undoes whatever the export did.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/file_io.h"
#include "engine/core/rng.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

TEST(GgufOutsideReader, EveryTensorIsWhereAndHowLlamaCppReadsIt) {
    const std::string package =
        (std::filesystem::path(TMX_BINARY).parent_path() / "npm/node_modules/@huggingface/gguf")
            .string();
    if (std::system("node --version >/dev/null 2>&1") != 0)
        GTEST_SKIP() << "node is not installed (scripts/test.sh installs it)";
    if (!std::filesystem::exists(package + "/package.json"))
        GTEST_SKIP() << "npm's @huggingface/gguf is not in " << package
                     << " (scripts/test.sh installs it)";
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("TMX_TEST_SEED=" + std::to_string(seed));
    test::TempDir tmp;
    Rng rng(seed);
    // test-tiny-swiglu: 6 query heads sharing 2 key/value heads of 8 dims, 5 experts; untied so
    // that `output` is written too.
    const std::string ckpt =
        test::make_cli_checkpoint(tmp, rng, R"({"tie_embeddings": false})", rng.next_u64());
    ASSERT_FALSE(ckpt.empty());
    const std::string gguf = tmp / "m.gguf";
    const auto r =
        test::run_tmx("export --model " + ckpt + " --format gguf --dtype f32 --out " + gguf);
    ASSERT_EQ(r.exit_code, 0) << r.err;

    const std::string out = tmp / "reader.out";
    const std::string cmd = "TMX_GGUF_PACKAGE=" + package + " node " + test::source_dir() +
                            "/tests/clients/gguf_reader.cjs " + gguf + " " + ckpt + " >" + out +
                            " 2>&1";
    const int status = std::system(cmd.c_str());
    const std::string text = read_file(out);
    ASSERT_EQ(status, 0) << text;
    const size_t ok = text.rfind("gguf reader: ok");
    ASSERT_NE(ok, std::string::npos) << text;
    // What the reader saw: every q and k row of both layers compared, and the header as
    // llama.cpp's loader finds it.
    const auto seen = nlohmann::json::parse(text.substr(0, ok));
    const nlohmann::json config = nlohmann::json::parse(read_file(ckpt + "/config.json"));
    const int64_t layers = config["n_layers"], heads = config["n_heads"],
                  kv_heads = config["n_kv_heads"], head_dim = config["head_dim"];
    EXPECT_EQ(seen["ropeRowsChecked"].get<int64_t>(), layers * (heads + kv_heads) * head_dim);
    EXPECT_EQ(seen["metadata"]["general.architecture"], "llama");
    // token_embd, output_norm, output, and per layer 10: 2 norms, 4 of attention, the router
    // and 3 expert stacks.
    EXPECT_EQ(seen["tensors"].size(), static_cast<size_t>(3 + 10 * layers));
}

}  // namespace
}  // namespace tmx
