-- concurrency (engine/concurrency.go): requests in flight, a sliding log
-- (alg/sliding_log.lua) whose window is the lease_ttl (sent as the item's
-- window). It is the log but for consume: hits beyond the limit's entries
-- (charged when denied) join the newest entry at that entry's instant, so
-- that they never make an acquisition outlive its lease.

local ALG_CONCURRENCY = 5

local concurrency = {
  locate = log.locate,
  load = log.load,
  admits = log.admits,
  consume = log.consume_keeping,
  give_back = log.give_back,
  remaining = log.remaining,
  reset_at = log.reset_at,
  retry_at = log.retry_at,
  restore = log.restore,
  write = log.write,
  undo = log.undo,
  finish_undo = log.finish_undo,
}
algorithms[ALG_CONCURRENCY] = concurrency
