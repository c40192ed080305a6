-- aiolock redlock: release a Redlock hold on one master, and announce it.
--
-- KEYS[1]  lock key on this master: a string holding the holder's token
-- KEYS[2]  void marker of the acquisition that took the hold (the acquire's KEYS[2])
-- ARGV[1]  token of the hold being released
-- ARGV[2]  lifetime of the void marker in milliseconds (longer than any delayed acquire)
-- The release channel is KEYS[1] .. ':released'; the message is the token, which starts
-- with the releasing manager's id (it ignores its own messages), and names the release
-- (every master sends one: a waiter counts it once).
--
-- Returns 1 + n if this master had the key for the token (now deleted, and the release
-- published to the n clients subscribed here, the releasing manager included if it
-- listens), 0 if not (expired, never set here, another token, or a resend of a release
-- that already ran: releasing twice is harmless), after leaving the void marker.
--
-- The void marker: a round is decided by a majority, so the acquire may still be on its
-- way to this master (on a connection of its own, delayed) when the release, sent on
-- another connection, runs here. Without the marker it would then set a key that nobody
-- holds and nobody releases, for the whole lease (issue 36). Where the key holds the
-- token, the acquire has run here: no marker, so a release leaves nothing behind.
--@include _kinds/_lua/tombstone

if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  return 1 + redis.call('publish', KEYS[1] .. ':released', ARGV[1])
end
void_attempt(KEYS[2], ARGV[2])
return 0
