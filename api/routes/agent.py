"""Agent endpoints (agt_ keys with scopes, limited to the workspaces the key was granted)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.auth import require_agent, state
from api.http import body_model, ok
from api.openapi import AGENT_KEY, Doc, document
from api.routes.accounts import PROGRAM_EXAMPLE
from ingest import control
from ingest.domain.errors import ProgramNotFound, StripeAccountInUse
from ingest.domain.inputs import SettingsPatch
from ingest.domain.records import Credential, Program


def _program(request: Request, agent: Credential) -> Program:
    program_id = request.path_params["program_id"]
    program = state(request).store.program(program_id)
    if program is None or program.workspace_id not in agent.workspace_ids:
        raise ProgramNotFound(f"program {program_id} not found")
    return program


async def list_programs(request: Request) -> Response:
    agent = require_agent(request, "programs:read")
    st = state(request)
    programs = st.store.programs_in(sorted(agent.workspace_ids))
    return ok(request, [control.program_view(st.store, p) for p in programs])


async def get_program(request: Request) -> Response:
    agent = require_agent(request, "programs:read")
    return ok(request, control.program_view(state(request).store, _program(request, agent)))


async def patch_program(request: Request) -> Response:
    agent = require_agent(request, "programs:write")
    program = _program(request, agent)
    _, inp = await body_model(request, SettingsPatch)
    st = state(request)
    updated = await control.update_program(st.store, st.writer, program, inp, agent.subject_id)
    return ok(request, control.program_view(st.store, updated))


routes = [
    Route("/api/agent/v1/programs", list_programs, methods=["GET"]),
    Route("/api/agent/v1/programs/{program_id}", get_program, methods=["GET"]),
    Route("/api/agent/v1/programs/{program_id}", patch_program, methods=["PATCH"]),
]

_GRANTED = "Limited to the workspaces the key was granted; scope `{}`."
document(
    {
        list_programs: Doc(
            "Programs of the granted workspaces",
            "agent",
            description=_GRANTED.format("programs:read"),
            auth=(AGENT_KEY,),
            data=list[schemas.Program],
            result=[PROGRAM_EXAMPLE],
        ),
        get_program: Doc(
            "A program",
            "agent",
            description=_GRANTED.format("programs:read"),
            auth=(AGENT_KEY,),
            data=schemas.Program,
            result=PROGRAM_EXAMPLE,
            errors=(ProgramNotFound,),
        ),
        patch_program: Doc(
            "Change a program's settings",
            "agent",
            description=_GRANTED.format("programs:write"),
            auth=(AGENT_KEY,),
            body=SettingsPatch,
            example={"commission_bps": 2500},
            data=schemas.Program,
            result=PROGRAM_EXAMPLE,
            errors=(ProgramNotFound, StripeAccountInUse),
            writes=True,
        ),
    }
)
