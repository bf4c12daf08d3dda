#!/bin/bash
# Hidden test (copied in only after the agent has finished).
cd /app
timeout 60 python3 -I /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
