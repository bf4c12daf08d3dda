#!/bin/bash
cd /tests && python3 -I test_outputs.py > /logs/verifier/output.txt 2>&1
echo $(( $? == 0 )) > /logs/verifier/reward.txt
