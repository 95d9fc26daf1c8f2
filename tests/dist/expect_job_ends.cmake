# cmake -DMPIEXEC=<mpiexec> -DARGS=<arguments, joined by '|'> -DLIMIT=<seconds>
#       -DEXPECT=<regex> -P expect_job_ends.cmake
# Passes when the job exits with a failure status within LIMIT seconds and its stderr matches
# EXPECT: a job in which a rank stopped answering must end, and say why.
string(REPLACE "|" ";" args "${ARGS}")
list(REMOVE_ITEM args "")
string(TIMESTAMP start "%s" UTC)
# The job gets twice the limit, so that one that ends late is told apart from one that hangs.
math(EXPR kill_after "2 * ${LIMIT}")
execute_process(COMMAND "${MPIEXEC}" ${args} RESULT_VARIABLE status OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT ${kill_after})
string(TIMESTAMP end "%s" UTC)
math(EXPR took "${end} - ${start}")
message("${out}${err}")
if(status MATCHES "timeout")
  message(FATAL_ERROR "the job did not end within ${kill_after} s")
elseif(status EQUAL 0)
  message(FATAL_ERROR "the job ended successfully after ${took} s; expected a failure")
elseif(took GREATER LIMIT)
  message(FATAL_ERROR "the job took ${took} s to end; expected at most ${LIMIT} s")
elseif(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "the job's stderr does not match '${EXPECT}'")
endif()
message("the job ended with status ${status} after ${took} s, as expected")
