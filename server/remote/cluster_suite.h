// ClusterSuite: a GoogleTest fixture whose tests share one real Redis Cluster
// of three masters (RedisClusterFixture), started once for the suite; every
// test skips when redis-server is not installed.
#ifndef KVCACHE_SERVER_REMOTE_CLUSTER_SUITE_H_
#define KVCACHE_SERVER_REMOTE_CLUSTER_SUITE_H_

#include <gtest/gtest.h>

#include "server/remote/redis_cluster_fixture.h"

namespace kvcache::remote_test {

class ClusterSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!RedisClusterFixture::Available()) return;
    cluster_ = new RedisClusterFixture();
    start_ = cluster_->Start(3);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (cluster_ == nullptr) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(start_.ok()) << start_;
  }

  static inline RedisClusterFixture* cluster_ = nullptr;
  static inline absl::Status start_;
};

}  // namespace kvcache::remote_test

#endif  // KVCACHE_SERVER_REMOTE_CLUSTER_SUITE_H_
