-- aiolock redlock: undo one master's part of an acquisition that failed or was cancelled.
--
-- KEYS[1]  lock key on this master: a string holding the holder's token
-- KEYS[2]  void marker of the acquisition (the acquire script's KEYS[2])
-- ARGV[1]  token of the acquisition
-- ARGV[2]  lifetime of the void marker in milliseconds (longer than any delayed acquire)
-- The release channel is KEYS[1] .. ':released'; the message is the token.
--
-- Returns 1 if the acquisition had taken this master (the key is deleted and the release
-- published), else 0. Either way the void marker is set first: an acquire still on its
-- way to this master (or resent by the client after a dropped connection) does nothing
-- when it arrives. The undo goes out on another connection than the acquire, so Redis
-- may run it first (see _kinds/_lua/tombstone).
--@include _kinds/_lua/tombstone

void_attempt(KEYS[2], ARGV[2])
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[1] .. ':released', ARGV[1])
  return 1
end
return 0
