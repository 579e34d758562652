// Temporary file names (io/file.hpp): beside their target, hidden, and unique across the nodes of
// a job that share the folder (host and pid, not the pid alone) and across calls.
#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <string>

#include "mergepipe/io/file.hpp"

using namespace mergepipe;

TEST(TempNames, BesideTheTargetHiddenAndUniquePerHostAndCall) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string pid = std::to_string(::getpid());
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string t = io::temp_sibling_path("/shared/out/model.safetensors");
    EXPECT_EQ(t.rfind("/shared/out/.model.safetensors.tmp-", 0), 0u) << t;
    EXPECT_NE(t.find(std::string("-") + host + "-" + pid + "-"), std::string::npos) << t;
    EXPECT_TRUE(seen.insert(t).second) << t;
  }
  // A bare name stays in the current folder.
  EXPECT_EQ(io::temp_sibling_path("catalog.h5").rfind(".catalog.h5.tmp-", 0), 0u);
}
