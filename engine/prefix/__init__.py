"""The prefix cache: finished rows' KV kept in RAM and on SSD, matched by token prefix on
the next request of a session (the scheduler calls it through `schedule.RowHooks`)."""
