#!/bin/bash
# Hidden test (copied in only after the agent has finished). Kills every worker it started.
cd /app
timeout 60 python3 -I /tests/test_outputs.py
status=$?
python3 -I /tests/test_outputs.py --kill-all
if [ $status -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
