// Reading user-given files: a FIFO, device or directory where a regular file is expected is an
// error naming the path, never a hang or an unbounded read. Replacing a directory whole.
#include "engine/core/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "engine/core/errors.h"
#include "tests/test_util.h"

namespace tmx {
namespace {

// Unblocks anyone stuck opening `fifo` for reading by opening it for writing after a while,
// then closing it (the reader sees an empty file), so that a regression fails instead of
// hanging the suite.
class FifoWatchdog {
  public:
    explicit FifoWatchdog(std::string fifo)
        : thread_([this, fifo = std::move(fifo)] {
              const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
              while (!done_ && std::chrono::steady_clock::now() < deadline)
                  std::this_thread::sleep_for(std::chrono::milliseconds(10));
              if (done_) return;
              // Succeeds only while a reader has it open.
              const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
              if (fd >= 0) ::close(fd);
          }) {}
    ~FifoWatchdog() {
        done_ = true;
        thread_.join();
    }

  private:
    std::atomic<bool> done_{false};
    std::thread thread_;
};

std::string read_error(const std::string& path) {
    try {
        read_file(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(FileIo, SpecialFilesAreErrorsNamingThePath) {
    test::TempDir tmp;
    const std::string fifo = tmp / "pipe.json";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    {
        FifoWatchdog watchdog(fifo);
        // ASSERT: reading /dev/zero below would never end where this fails.
        ASSERT_EQ(read_error(fifo), fifo + ": is a FIFO (named pipe), expected a regular file");
    }
    ASSERT_EQ(read_error(tmp.path().string()),
              tmp.path().string() + ": is a directory, expected a regular file");
    // /dev/zero would never end.
    EXPECT_EQ(read_error("/dev/zero"), "/dev/zero: is a character device, expected a regular file");
    EXPECT_EQ(read_error(tmp / "absent"),
              tmp / "absent" + ": cannot open: No such file or directory");

    const std::string plain = tmp / "plain.txt";
    test::write_text(plain, "hello");
    EXPECT_EQ(read_file(plain), "hello");
}

// Through the CLI: a config that is a FIFO, and a checkpoint whose weights file is one.
TEST(FileIo, CommandsRefuseAFifoInsteadOfWaiting) {
    test::TempDir tmp;
    const std::string fifo = tmp / "config.json";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    FifoWatchdog watchdog(fifo);
    auto r = test::run_tmx("params --config " + fifo);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(fifo + ": is a FIFO (named pipe), expected a regular file"),
              std::string::npos)
        << r.err;
}

std::string replace_error(const std::string& tmp, const std::string& dir) {
    try {
        replace_directory(tmp, dir, "thing", WithoutExchange::Fail);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(FileIo, ReplaceDirectoryMovesANewDirectoryIntoPlace) {
    test::TempDir tmp;
    std::filesystem::create_directory(tmp / "out.tmp");
    test::write_text(tmp / "out.tmp/a.txt", "new");
    EXPECT_EQ(replace_directory(tmp / "out.tmp", tmp / "out", "thing", WithoutExchange::Fail), "");
    EXPECT_EQ(read_file(tmp / "out/a.txt"), "new");
    EXPECT_FALSE(std::filesystem::exists(tmp / "out.tmp"));
}

TEST(FileIo, ReplaceDirectorySwapsAnExistingOneAndReturnsThePreviousContents) {
    test::TempDir tmp;
    std::filesystem::create_directory(tmp / "out");
    test::write_text(tmp / "out/a.txt", "old");
    std::filesystem::create_directory(tmp / "out.tmp");
    test::write_text(tmp / "out.tmp/a.txt", "new");
    const std::string previous =
        replace_directory(tmp / "out.tmp", tmp / "out", "thing", WithoutExchange::MoveAside);
    EXPECT_EQ(read_file(tmp / "out/a.txt"), "new");
    ASSERT_FALSE(previous.empty());
    EXPECT_EQ(read_file(previous + "/a.txt"), "old");
}

TEST(FileIo, ReplaceDirectoryErrorsNameTheDirectory) {
    test::TempDir tmp;
    const std::string dir = tmp / "out";
    EXPECT_EQ(replace_error(tmp / "absent", dir),
              dir + ": cannot move the thing into place: No such file or directory");
    std::filesystem::create_directory(dir);
    EXPECT_EQ(replace_error(tmp / "absent", dir),
              dir + ": cannot replace the thing: No such file or directory");
    fsync_path(tmp / "absent");  // best effort: no error
}

// A file written in pieces appears under its name only when committed; an abandoned one
// (an error, an interruption) leaves nothing behind, not even its temporary file.
TEST(AtomicFileWriter, TheFileAppearsWholeOnCommitAndNothingRemainsWithout) {
    test::TempDir dir;
    const std::string path = dir / "out.bin";
    const std::string first(1000 + test::fresh_seed() % 1000, 'a'), second = "tail";
    {
        AtomicFileWriter w(path);
        w.write(first);
        EXPECT_FALSE(std::filesystem::exists(path));
        w.write(second);
        EXPECT_EQ(w.bytes_written(), first.size() + second.size());
        w.commit();
    }
    EXPECT_EQ(read_file(path), first + second);
    {
        AtomicFileWriter w(dir / "abandoned.bin");
        w.write(first);
    }
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                            std::filesystem::directory_iterator()),
              1);
}

}  // namespace
}  // namespace tmx
