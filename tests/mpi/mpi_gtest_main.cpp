// GoogleTest main for MPI test binaries: only rank 0 prints; the job fails if any rank fails.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // MERGEPIPE_TEST_VERBOSE_RANKS=1 keeps every rank's output (to debug a failure on one rank).
  if (rank != 0 && !std::getenv("MERGEPIPE_TEST_VERBOSE_RANKS")) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return global;
}
