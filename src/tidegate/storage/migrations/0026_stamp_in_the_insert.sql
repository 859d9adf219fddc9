-- A webhook's run is stamped on its key's clock by admit_webhook's own insert, as every
-- other writer stamps its runs: the per-row trigger that stamped runs inserted without
-- a virtual time (vtime 0) goes, and with it a trigger check on every inserted run.
-- Its function, stamp_vtime, is dropped by migrate with every function no file defines.
DROP TRIGGER IF EXISTS runs_stamp_vtime ON runs;
