-- aiolock lock prelude: the lock scripts' reply codes and the free state's default keep,
-- named once. Spliced in at the top of every lock script that replies with a code or
-- keeps a free state (`--@include _kinds/lock/codes`; aiolock/_redis/scripts.py): plain
-- constants, which cost the server nothing per call, so they come before the common
-- paths (the state's functions in state.lua come after them).
--
-- Python names the same codes in aiolock/_engine/kind.py (AttemptReply, ReleaseReply,
-- ChangeReply) and the keep in aiolock/_kinds/lock/state.py (DEFAULT_KEEP_MS);
-- tests/unit/_kinds/lock/test_state.py reads this file and checks that the names and
-- numbers match. One `local` line per group, `NAME, NAME = n, n`: the test reads them so.

-- acquire.lua's {code, value} (AttemptReply)
local ACQUIRED, REENTERED, BUSY, VOIDED, BAD_KEY = 1, 2, 0, 3, -1
-- release.lua's {code, value} (ReleaseReply; BAD_KEY as above)
local STILL_HELD, RELEASED, HANDED_OVER, NOT_HELD = 1, 2, 4, 0
-- detach.lua, adopt.lua, give_back.lua, force_release.lua (ChangeReply; VOIDED and
-- BAD_KEY as above)
local DONE, NOT_DONE = 1, 0
-- How long a free state is kept (ms) when release.lua's ARGV[3] is left out: the keep of
-- a manager with the default fence_ttl (60 s)
local KEEP_MS = '60000'
