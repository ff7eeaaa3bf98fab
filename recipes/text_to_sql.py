"""Recipe: text-to-SQL over the sample shop database, read-only.

    python recipes/text_to_sql.py "Which products are out of stock?"

The SQL is decoded under a grammar compiled from the file's schema (only SELECT, only its
tables and columns); the prompt's DDL is labelled for the KV policy; the query runs on a
connection that cannot modify the file, with a time limit and a row limit.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.integrations.sql_answer import SqlAnswer
from pask_agent.runtime.runtime import Runtime

SHOP = Path(__file__).resolve().parent / "data" / "shop.sqlite"
QUESTIONS = ["How many customers live in Germany?", "Which products are out of stock?"]


async def main(questions: list[str] = QUESTIONS, *, policy: str | None = None) -> list[SqlAnswer]:
    async with Runtime.open("default") as rt:
        assistant = SQLiteAssistant(SHOP, runtime=rt)
        answers = []
        for question in questions:
            answer = await assistant.ask(question, policy=policy)
            print(f"Q: {question}\n{answer.sql}\n{answer.table(10)}\n")
            answers.append(answer)
        assistant.close()
        return answers


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or QUESTIONS))
